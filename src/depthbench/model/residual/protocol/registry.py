"""The registry of residual families: one line per family, and the public hook.

The shared tests, the trainer, the cost model, the config schema, the
sharding rules and the analyses iterate over this table; adding a family is
one new file in ``depthbench.model.residual`` plus one line in ``_BUILTIN``.  A family defined
elsewhere (a user's module, a test) joins with :func:`register`; to have every
process load it (the CLI, sweep workers, test subprocesses), name its module
in the environment: ``DEPTHBENCH_FAMILIES=my_families depthbench train ...``
imports ``my_families`` (comma-separate several) after the built-ins, and the
module registers its classes.

From the families' declarations the registry assembles what used to be
written out centrally: each family's typed config, ``config.model.residual``
(:func:`family_config`), the family rows of the sharding table
(:func:`sharding_rules`) and the analysis switches (:func:`analysis_options`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from typing import Any

from depthbench.errors import ConfigError
from depthbench.model.residual.protocol.base import ResidualFamily
from depthbench.model.residual.protocol.capabilities import AnalysisOptions, Variants
from depthbench.model.residual.protocol.family_config import FamilyConfig

# The built-in families, "module:Class" under depthbench.model.residual, in the
# order every listing, sweep and table uses.  A new family is one line here.
FAMILY_PACKAGE = "depthbench.model.residual"
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


def _check_config(cls: type[ResidualFamily]) -> None:
    """The family's ``Config`` is a frozen FamilyConfig dataclass of bool, int,
    float and str fields, its variants set its own fields with their types."""
    config = cls.Config
    if not (isinstance(config, type) and issubclass(config, FamilyConfig)
            and dataclasses.is_dataclass(config) and config.__dataclass_params__.frozen):
        raise TypeError(f"register: {cls.name}.Config is not a frozen FamilyConfig dataclass")
    types = config.field_types()
    for name, kind in types.items():
        if kind not in (bool, int, float, str):
            raise TypeError(f"register: {cls.name}.Config.{name} is a {kind}, not bool, int, "
                            "float or str")
    for variant, values in (config.variants if issubclass(config, Variants) else {}).items():
        try:
            config.from_fields(values, cls.name)
        except ConfigError as e:
            raise TypeError(f"register: {cls.name} variant {variant!r}: {e}") from None


def register(cls: type[ResidualFamily]) -> type[ResidualFamily]:
    """Add a family (usable as a class decorator).  Its ``name`` must be new, and
    the fields and sharding rules it shares with registered families must agree
    (a shared field has one type)."""
    if not (isinstance(cls, type) and issubclass(cls, ResidualFamily)) or not cls.name:
        raise TypeError(f"register: {cls!r} is not a ResidualFamily subclass with a name")
    if cls.name in FAMILIES and FAMILIES[cls.name] is not cls:
        raise ValueError(f"register: a family named {cls.name!r} is already registered")
    _check_config(cls)
    fields, rules = _field_table(), _rule_table()
    _merge("field", fields, _typed_fields(cls), cls.name)
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
    """The family of ``spec`` (a ModelSpec); a spec without a config takes the
    family's defaults.  One instance per (class, spec): a family is a frozen
    function of its spec, so every caller (the model, its decoder, the
    optimizer's rules, an export) holds the same one."""
    cls = get(spec.family)
    try:
        return _build(cls, spec)
    except TypeError:  # a field value that cannot be hashed (a list): build it anew
        return cls(spec)


@functools.lru_cache(maxsize=512)
def _build(cls: type[ResidualFamily], spec) -> ResidualFamily:
    return cls(spec)


def baseline() -> str:
    """The family every other is measured against (the one declaring ``baseline``)."""
    found = [name for name, cls in FAMILIES.items() if cls.baseline]
    if len(found) != 1:
        raise RuntimeError(f"registry: {len(found)} families declare baseline: {found}")
    return found[0]


def with_capability(capability: type) -> list[str]:
    """The registered families deriving from ``capability``, in registry order."""
    return [name for name, cls in FAMILIES.items() if issubclass(cls, capability)]


def family_config(name: str, fields: dict[str, Any]) -> FamilyConfig:
    """Family ``name``'s typed config with ``fields`` (the others default): a
    field it does not declare, or a value of another type, is one ConfigError."""
    return get(name).Config.from_fields(fields, name)


def _typed_fields(cls: type[ResidualFamily]):
    """(name, type) of the family's fields: what two families sharing a field must
    agree on.  Each may default it as its original did (hc's ``readout`` sums the
    normalised streams, mhc's averages them first); ``config`` keeps a shared
    field across a family switch only when it was set (``_switch_family``)."""
    types = cls.Config.field_types()
    return [(name, types[name].__name__) for name in cls.config_fields()]


def _field_table() -> dict[str, tuple[Any, str]]:
    table: dict[str, tuple[Any, str]] = {}
    for cls in FAMILIES.values():
        _merge("field", table, _typed_fields(cls), cls.name)
    return table


def _rule_table() -> dict[str, tuple[Any, str]]:
    table: dict[str, tuple[Any, str]] = {}
    for cls in FAMILIES.values():
        _merge("sharding rule", table, cls.sharding_rules, cls.name)
    return table


def sharding_rules() -> tuple[tuple[str, Any], ...]:
    """The families' logical-axis rules, in registry order (each name once)."""
    return tuple((name, axes) for name, (axes, _) in _rule_table().items())


def analysis_options() -> dict[str, tuple[str, ...]]:
    """Every analysis switch a registered family declares, with its values (the
    first the default); two families declaring one switch must agree."""
    table: dict[str, tuple[Any, str]] = {}
    for cls in FAMILIES.values():
        if issubclass(cls, AnalysisOptions):
            _merge("analysis option", table, cls.analysis_options.items(), cls.name)
    return {name: values for name, (values, _) in table.items()}


for _entry in _BUILTIN:
    _module, _class = _entry.split(":")
    register(vars(importlib.import_module(f"{FAMILY_PACKAGE}.{_module}"))[_class])


def load_plugins(text: str) -> list[str]:
    """Import the comma-separated modules of ``text`` (``$DEPTHBENCH_FAMILIES``);
    they register their families.  Whatever goes wrong in one (not found, raises
    on import, registers a name already taken, declares a field two ways) is one
    ConfigError naming the variable and the module: it is bad input, exit status
    2, not a traceback from inside the import."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    before = dict(FAMILIES)
    try:
        for name in names:
            _import_plugin(name)
    except ConfigError:
        FAMILIES.clear()
        FAMILIES.update(before)  # what a failed module registered goes with it
        raise
    return names


def _import_plugin(name: str) -> None:
    """Import one family module, every failure as one ConfigError naming it."""
    if not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(f"${PLUGINS_ENV}: {name!r} is not a module name; expected "
                          "comma-separated importable modules like my_families or "
                          "pkg.families (not files)")
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name and not name.startswith(f"{e.name}."):
            raise _plugin_error(name, e) from e  # the module imports something missing
        file = " (a module name, not a file name)" if name.endswith(".py") else ""
        raise ConfigError(f"${PLUGINS_ENV}: no module named {name!r}{file}; is its "
                          "directory on PYTHONPATH?") from e
    except Exception as e:
        raise _plugin_error(name, e) from e


def _plugin_error(name: str, e: Exception) -> ConfigError:
    """One line for a family module that failed while importing."""
    what = " ".join(str(e).split()) or "(no message)"
    return ConfigError(f"${PLUGINS_ENV}: module {name!r} failed on import: "
                       f"{type(e).__name__}: {what}")


# Families from outside the package: modules named in DEPTHBENCH_FAMILIES.
load_plugins(os.environ.get(PLUGINS_ENV, ""))
