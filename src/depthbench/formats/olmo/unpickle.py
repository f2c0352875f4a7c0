"""Unpickling an untrusted file: only the classes the caller allows, nothing executed.

A pickle is a program: its ``GLOBAL``/``STACK_GLOBAL`` opcodes import any
module and fetch any attribute, and ``REDUCE`` calls what they fetched (a
``.metadata`` whose pickle names ``os.system`` runs a shell command when
``pickle.load`` reads it).  Checkpoints come from hubs, so every pickle
depthbench reads goes through :func:`loads`:

* every class or function the pickle names is looked up in the caller's
  allow-list, a mapping ``(module, name) -> stand-in``; the stand-in is
  depthbench's own (a record type, a converter), never the named object,
  so no module the pickle names is imported and nothing it names runs;
* a name outside the list raises :class:`Refused` naming it, before any
  object is built from it;
* persistent ids (torch's storages) go to the caller's ``persistent_load``,
  or are refused.

The stand-ins below cover what torch's own index and tensor pickles use:
:class:`Record` (a dataclass-like object filled by ``BUILD``), ``torch.Size``
as a tuple of ints, a dtype as its name.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Mapping
from typing import Any


class Refused(Exception):
    """The pickle names something outside the allow-list (``what``: ``module.name``)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


class Record:
    """The stand-in of an allowed class: attributes from the pickle's ``BUILD``
    state (a dict, a ``(dict, slots)`` pair, or a tuple for ``positional``).
    ``kind`` names the class it stands for."""

    kind = "record"
    positional: tuple[str, ...] = ()

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and all(
                s is None or isinstance(s, dict) for s in state):
            state = {**(state[0] or {}), **(state[1] or {})}
        elif isinstance(state, tuple) and self.positional and len(state) <= len(self.positional):
            state = dict(zip(self.positional, state, strict=False))  # (a prefix of them)
        if not isinstance(state, dict) or not all(
                isinstance(k, str) and not k.startswith("__") for k in state):
            # (a dunder key could shadow __setstate__ for a later BUILD)
            raise pickle.UnpicklingError(f"{self.kind}: unexpected state {type(state).__name__}")
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"{self.kind}({self.__dict__})"


def record(kind: str, positional: tuple[str, ...] = ()) -> type[Record]:
    """A :class:`Record` subclass standing for the class ``kind``."""
    return type(kind, (Record,), {"kind": kind, "positional": positional})


def int_tuple(values: Any = ()) -> tuple[int, ...]:
    """``torch.Size(values)`` as a plain tuple of non-negative ints."""
    out = tuple(values)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in out):
        raise pickle.UnpicklingError("a size holds something other than non-negative ints")
    return out


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, allowed: Mapping[tuple[str, str], Any],
                 persistent: Callable[[Any], Any] | None):
        super().__init__(file)
        self._allowed = allowed
        self._persistent = persistent

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
          persistent_load: Callable[[Any], Any] | None = None) -> Any:
    """The object pickled in ``data``, built only from ``allowed`` stand-ins.

    Raises :class:`Refused` for a name outside ``allowed`` and whatever
    ``pickle`` raises for a malformed stream (callers report both as one
    line)."""
    return _Unpickler(io.BytesIO(data), allowed, persistent_load).load()
