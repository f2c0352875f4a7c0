"""The registry of residual families: one line per family, and the public hook.

The shared tests, the trainer, the cost model, the config schema, the
sharding rules and the analyses iterate over this table; adding a family is
one new file in this package plus one line in ``_BUILTIN``.  A family defined
elsewhere (a user's module, a test) joins with :func:`register`; to have every
process load it (the CLI, sweep workers, test subprocesses), name its module
in the environment: ``DEPTHBENCH_FAMILIES=my_families depthbench train ...``
imports ``my_families`` (comma-separate several) after the built-ins, and the
module registers its classes.

From the families' declarations the registry assembles what used to be
written out centrally: the ``model.residual`` section of the config schema
(:func:`residual_defaults`) and the family rows of the sharding table
(:func:`sharding_rules`).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from depthbench.errors import ConfigError
from depthbench.model.residual.base import ResidualFamily

# The built-in families, "module:Class" under depthbench.model.residual, in the
# order every listing, sweep and table uses.  A new family is one line here.
_BUILTIN = (
    "pre_ln:PreLN",
    "sandwich_ln:SandwichLN",
    "lns:LNS",
    "deepnorm:DeepNorm",
    "keel:Keel",
    "hc:HC",
    "mhc:MHC",
    "attnres:AttnResFull",
    "attnres:AttnResBlock",
    "moda:MoDA",
    "post_ln:PostLN",
    "mix_ln:MixLN",
    "completep:CompleteP",
)

FAMILIES: dict[str, type[ResidualFamily]] = {}
PLUGINS_ENV = "DEPTHBENCH_FAMILIES"  # comma-separated modules that register families


def _merge(what: str, table: dict, items, owner: str) -> None:
    """Add ``items`` to ``table``, refusing a name declared twice with two values."""
    for key, value in items:
        if key in table and table[key][0] != value:
            raise ValueError(f"{owner} declares {what} {key!r} = {value!r}, but "
                             f"{table[key][1]} declares {table[key][0]!r}")
        table.setdefault(key, (value, owner))


def register(cls: type[ResidualFamily]) -> type[ResidualFamily]:
    """Add a family (usable as a class decorator).  Its ``name`` must be new, and
    the fields and sharding rules it shares with registered families must agree."""
    if not (isinstance(cls, type) and issubclass(cls, ResidualFamily)) or not cls.name:
        raise TypeError(f"register: {cls!r} is not a ResidualFamily subclass with a name")
    if cls.name in FAMILIES and FAMILIES[cls.name] is not cls:
        raise ValueError(f"register: a family named {cls.name!r} is already registered")
    fields, rules = _field_table(), _rule_table()
    _merge("field", fields, cls.config_fields().items(), cls.name)
    _merge("sharding rule", rules, cls.sharding_rules, cls.name)
    FAMILIES[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a family added with :func:`register` (tests clean up with it)."""
    FAMILIES.pop(name, None)


def names() -> list[str]:
    return list(FAMILIES)


def get(name: str) -> type[ResidualFamily]:
    if name not in FAMILIES:
        raise ConfigError(f"config.model.family: {name!r} is not one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def build(spec) -> ResidualFamily:
    """The family of ``spec`` (a ModelSpec), its fields missing from the spec
    taking the family's declared defaults."""
    cls = get(spec.family)
    given = dict(spec.residual)
    missing = {k: v for k, v in cls.config_fields().items() if k not in given}
    if missing:
        spec = spec.replace(residual=tuple(sorted({**given, **missing}.items())))
    return cls(spec)


def _field_table() -> dict[str, tuple[Any, str]]:
    table: dict[str, tuple[Any, str]] = {}
    for cls in FAMILIES.values():
        _merge("field", table, cls.config_fields().items(), cls.name)
    return table


def _rule_table() -> dict[str, tuple[Any, str]]:
    table: dict[str, tuple[Any, str]] = {}
    for cls in FAMILIES.values():
        _merge("sharding rule", table, cls.sharding_rules, cls.name)
    return table


def residual_defaults() -> dict[str, Any]:
    """The ``model.residual`` section of the schema: every registered family's
    fields with their defaults, in registry order."""
    return {name: value for name, (value, _) in _field_table().items()}


def sharding_rules() -> tuple[tuple[str, Any], ...]:
    """The families' logical-axis rules, in registry order (each name once)."""
    return tuple((name, axes) for name, (axes, _) in _rule_table().items())


for _entry in _BUILTIN:
    _module, _class = _entry.split(":")
    register(getattr(importlib.import_module(f"{__name__.rpartition('.')[0]}.{_module}"), _class))

# Families from outside the package: modules named in DEPTHBENCH_FAMILIES.
for _name in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
    try:
        importlib.import_module(_name)
    except ImportError as e:
        raise ImportError(f"{PLUGINS_ENV}: cannot import {_name!r}: {e}") from e
