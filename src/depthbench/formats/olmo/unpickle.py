"""Unpickling an untrusted file: only the classes the caller allows, nothing executed.

A pickle is a program: its ``GLOBAL``/``STACK_GLOBAL`` opcodes import any
module and fetch any attribute, ``REDUCE`` calls what they fetched (a
``.metadata`` whose pickle names ``os.system`` runs a shell command when
``pickle.load`` reads it) and ``BUILD`` sets attributes on whatever is on its
stack.  Checkpoints come from hubs, so every pickle depthbench reads goes
through :func:`loads`:

* every class or function the pickle names is looked up in the caller's
  allow-list, a mapping ``(module, name) -> stand-in``; the stand-in is
  depthbench's own, never the named object, so no module the pickle names
  is imported and nothing it names runs;
* a name outside the list raises :class:`Refused` naming it, before any
  object is built from it;
* the stand-ins cannot be changed by the pickle: a function is a
  :class:`Function` and a constant (a dtype) a :class:`Constant`, both
  immutable, whose ``BUILD`` is refused (a shared ``torch.float32`` renamed
  ``float64`` for the rest of the process, a depthbench function given
  another ``__qualname__``); an allowed class is a :class:`Record` type whose
  instances are filled only through its declared fields, each checked by
  its validator;
* only the opcodes torch's own pickles use are read (no sets, no
  protocol-0 instance opcodes, no out-of-band buffers: :data:`OPCODES`), and
  at most ``max_ops`` of them: each adds at most about a hundred bytes of
  objects (a dict, a memo entry) beside the bytes of text it carries, so
  memory is bounded whatever the pickle holds (callers bound its size too);
* persistent ids (torch's storages) go to the caller's ``persistent_load``,
  or are refused.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from collections.abc import Callable, Mapping
from typing import Any


class Refused(Exception):
    """The pickle names something outside the allow-list (``what``: ``module.name``)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


class Frozen:
    """A stand-in a pickle cannot change: no attribute can be set, ``BUILD`` is refused."""

    __slots__ = ()

    def __init__(self, **values: Any):
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self!r} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{self!r} is immutable")

    def __setstate__(self, state: Any) -> None:
        raise pickle.UnpicklingError(f"the pickle tries to change {self!r}")


class Function(Frozen):
    """An allowed callable (``REDUCE`` calls it with the pickle's arguments)."""

    __slots__ = ("name", "fn")

    def __init__(self, name: str, fn: Callable[..., Any]):
        super().__init__(name=name, fn=fn)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"<stand-in of {self.name}>"


class Constant(Frozen):
    """An allowed constant, by name (``torch.float32``: ``Constant("float32")``)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        super().__init__(name=name)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Constant) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"Constant({self.name!r})"


class Record:
    """The stand-in of an allowed class: attributes from the pickle's ``BUILD``
    state (a dict, a ``(dict, slots)`` pair, or a tuple for a positional
    record), only the declared ``fields``, each through its validator; a field
    the state leaves out is None.  ``kind`` names the class it stands for."""

    kind = "record"
    fields: Mapping[str, Callable[[Any], Any]] = {}
    positional = False

    def __setstate__(self, state: Any = None) -> None:
        if not isinstance(self, Record):  # BUILD on the class itself
            raise pickle.UnpicklingError("the pickle tries to change an allowed class")
        if isinstance(state, tuple) and len(state) == 2 and all(
                s is None or isinstance(s, dict) for s in state):
            state = {**(state[0] or {}), **(state[1] or {})}
        elif isinstance(state, tuple) and self.positional and len(state) <= len(self.fields):
            state = dict(zip(self.fields, state, strict=False))  # (a prefix of them)
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f"{self.kind}: unexpected state {type(state).__name__}")
        for key, value in state.items():
            check = self.fields.get(key) if isinstance(key, str) else None
            if check is None:
                raise pickle.UnpicklingError(f"{self.kind} has no field {str(key)[:40]!r}")
            self.__dict__[key] = check(value)

    def __getattr__(self, name: str) -> Any:
        if name in type(self).fields:
            return None  # a declared field the pickle left out
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"{self.kind}({self.__dict__})"


def record(kind: str, fields: Mapping[str, Callable[[Any], Any]] | None = None, *,
           positional: bool = False) -> type[Record]:
    """A :class:`Record` subclass standing for the class ``kind``, with ``fields``
    (name -> validator: returns the value, raises UnpicklingError); positional:
    its state may be a tuple of the fields in order."""
    return type(kind, (Record,), {"kind": kind, "fields": dict(fields or {}),
                                  "positional": positional, "__slots__": ()})


def anything(value: Any) -> Any:
    """The validator of a field nothing reads."""
    return value


def int_tuple(values: Any = ()) -> tuple[int, ...]:
    """``torch.Size(values)`` as a plain tuple of non-negative ints."""
    if not isinstance(values, (tuple, list)):
        raise pickle.UnpicklingError("a size is not a sequence of ints")
    out = tuple(values)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in out):
        raise pickle.UnpicklingError("a size holds something other than non-negative ints")
    return out


# The opcodes torch.save's pickles (protocol 2) and torch.distributed.checkpoint's
# index (protocol 4) use; any other is refused before it runs.
OPCODES = frozenset(getattr(pickle, name)[0] for name in (
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "NONE", "NEWTRUE", "NEWFALSE",
    "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
    "BINUNICODE8", "SHORT_BINBYTES", "BINBYTES", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2",
    "TUPLE3", "EMPTY_LIST", "APPEND", "APPENDS", "LIST", "EMPTY_DICT", "SETITEM", "SETITEMS",
    "DICT", "GLOBAL", "STACK_GLOBAL", "REDUCE", "NEWOBJ", "BUILD", "BINPERSID", "BINGET",
    "LONG_BINGET", "BINPUT", "LONG_BINPUT", "MEMOIZE"))


def _refusing(code: int) -> Callable[[Any], None]:
    name = next((op.name for op in pickletools.opcodes if ord(op.code) == code), hex(code))

    def refuse(self: Any) -> None:
        raise pickle.UnpicklingError(f"opcode {name}, which torch's pickles never use")

    return refuse


def _counted(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    def op(self: _Unpickler) -> None:
        self.ops_left -= 1
        if self.ops_left < 0:
            raise pickle.UnpicklingError(f"more than {self.max_ops:,} opcodes")
        fn(self)

    return op


class _Unpickler(pickle._Unpickler):  # the Python one: its opcode table can be narrowed
    dispatch = {code: (_counted(fn) if code in OPCODES else _refusing(code))
                for code, fn in pickle._Unpickler.dispatch.items()}

    def __init__(self, file, allowed: Mapping[tuple[str, str], Any],
                 persistent: Callable[[Any], Any] | None, max_ops: int):
        super().__init__(file)
        self._allowed = allowed
        self._persistent = persistent
        self.max_ops = self.ops_left = max_ops

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except (KeyError, TypeError):
            raise Refused(f"{module}.{name}") from None

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise Refused(f"persistent id {str(pid)[:60]}")
        return self._persistent(pid)


def loads(data: bytes, allowed: Mapping[tuple[str, str], Any], *,
          persistent_load: Callable[[Any], Any] | None = None, max_ops: int = 1 << 16) -> Any:
    """The object pickled in ``data``, built only from ``allowed`` stand-ins, in at
    most ``max_ops`` opcodes.

    Raises :class:`Refused` for a name outside ``allowed`` and whatever
    ``pickle`` raises for a malformed stream (callers report both as one
    line)."""
    return _Unpickler(io.BytesIO(data), allowed, persistent_load, max_ops).load()
