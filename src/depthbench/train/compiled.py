"""The compiled functions of a run, memoised by what they are built from: a view
of the config records every field read while building them, and a later config
reuses them when it agrees on those and runs on the same devices.  A field
nothing reads never forces a compilation; the key is no hand-kept list."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections

from depthbench import parallel
from depthbench.train import layer_stats
from depthbench.train import state as state_lib
from depthbench.train import step as step_lib

_MAX = 2
_ABSENT = object()  # a field read with .get() or `in` that the config lacks


@dataclasses.dataclass
class _Entry:
    reads: dict[str, Any]  # dotted field -> the value the builders saw
    devices: tuple[int, ...]
    functions: tuple


_COMPILED: list[_Entry] = []


class _Recorder:
    """A read-only view of a ConfigDict that notes every field read through it
    (a whole section when it is read as a dict)."""

    def __init__(self, node: ml_collections.ConfigDict, prefix: str, reads: dict[str, Any]):
        object.__setattr__(self, "_node", node)
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_reads", reads)

    def _field(self, name: str, value: Any) -> Any:
        if isinstance(value, ml_collections.ConfigDict):
            return _Recorder(value, f"{self._prefix}{name}.", self._reads)
        self._reads[self._prefix + name] = value
        return value

    def _whole(self) -> ml_collections.ConfigDict:
        """The section itself, every field of it noted as read."""
        for key, value in _flat(self._node).items():
            self._reads[self._prefix + key] = value
        return self._node

    def __getattr__(self, name: str) -> Any:
        if name in self._node:
            return self._field(name, self._node[name])
        return getattr(self._whole(), name)  # a method: to_dict(), items(), ...

    def __getitem__(self, name: str) -> Any:
        return self._field(name, self._node[name])

    def get(self, name: str, default: Any = None) -> Any:
        if name in self._node:
            return self._field(name, self._node[name])
        self._reads[self._prefix + name] = _ABSENT
        return default

    def __contains__(self, name: str) -> bool:
        if name not in self._node:
            self._reads[self._prefix + name] = _ABSENT
            return False
        return True

    def __iter__(self):
        return iter(self._whole())

    def __len__(self) -> int:
        return len(self._whole())

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError("the config is read-only while the compiled functions are built")


def _flat(node: ml_collections.ConfigDict) -> dict[str, Any]:
    out = {}
    for key, value in node.items():
        if isinstance(value, ml_collections.ConfigDict):
            out.update({f"{key}.{k}": v for k, v in _flat(value).items()})
        else:
            out[key] = value
    return out


def _value(config: ml_collections.ConfigDict, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _matches(entry: _Entry, config, devices: tuple[int, ...]) -> bool:
    return entry.devices == devices and all(
        _value(config, key) == value for key, value in entry.reads.items())


def _build(config) -> tuple:
    s = state_lib.setup(config, parallel.mesh_from_config(config))
    micro = int(config.train.microbatches)
    return (s, state_lib.make_init(s), step_lib.make_train_step(s, micro),
            step_lib.make_eval_step(s), layer_stats.make_layer_stats(s))


def compiled(config) -> tuple:
    """Setup and jitted functions (init, train, eval, layer stats) for ``config``
    on its mesh, memoised."""
    devices = tuple(d.id for d in jax.devices())
    for entry in _COMPILED:
        if _matches(entry, config, devices):
            return entry.functions
    reads: dict[str, Any] = {}
    functions = _build(_Recorder(config, "", reads))
    while len(_COMPILED) >= _MAX:
        _COMPILED.pop(0)
    _COMPILED.append(_Entry(reads, devices, functions))
    return functions


def fields_read(config) -> set[str]:
    """The config fields the compiled functions of ``config`` are built from
    (what the cache compares)."""
    compiled(config)
    devices = tuple(d.id for d in jax.devices())
    return next(set(e.reads) for e in _COMPILED if _matches(e, config, devices))
