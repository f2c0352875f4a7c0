"""A family's typed config (``config.model.residual``): the base dataclass and
the checks of its values (one ConfigError line each).

A family declares its fields as a frozen dataclass derived from
:class:`FamilyConfig`, in its own module, and names it in its class
(``Config = HCConfig``): the field's annotation is its type, the dataclass
default its default, and ``validate`` checks the values.  The registry and
``depthbench.config`` read everything from there, so ``config.model.residual``
holds exactly the chosen family's fields, and an override is parsed as its
declared type.

Field *names* are part of a run's identity (``config.json``, the run
directories of sweeps) and of users' sweep specs and ``--config.model.residual.*``
overrides: keep a field's name when its family changes.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from depthbench.errors import ConfigError

SECTION = "config.model.residual"


@dataclasses.dataclass(frozen=True)
class FamilyConfig:
    """The fields of a family with none (pre_ln's); a family's config derives
    from it and adds its own (frozen, so a spec holding one stays hashable)."""

    # What a run directory saved before a field existed meant by its absence,
    # for a field whose default is not the behaviour it replaced (mhc's Liger
    # form, attnres's eps): ``config.from_saved`` completes a saved config with
    # these, else with the defaults, so an old run computes what it computed.
    saved_before: ClassVar[dict[str, Any]] = {}

    def validate(self, config) -> None:
        """Raise ConfigError (one line) for a value out of range; ``config`` is the
        whole experiment config, for checks against the shape (moda's heads)."""

    @classmethod
    def field_types(cls) -> dict[str, type]:
        """Field name -> its declared type (bool, int, float or str)."""
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Field name -> default, in declaration order."""
        return {f.name: f.default for f in dataclasses.fields(cls)}

    @classmethod
    def saved_defaults(cls) -> dict[str, Any]:
        """Field name -> the value a saved config without it means."""
        return {**cls.defaults(), **cls.saved_before}

    @classmethod
    def from_fields(cls, given: Mapping[str, Any], family: str) -> FamilyConfig:
        """The config with ``given`` values (the rest default) for family ``family``:
        a name that is not a field, or a value not of its field's type, is one
        ConfigError line."""
        types = cls.field_types()
        for name in given:
            if name not in types:
                raise unknown_field(name, family, types)
        return cls(**{name: coerce(name, value, types[name]) for name, value in given.items()})

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def unknown_field(name: str, family: str, types: Iterable[str]) -> ConfigError:
    """The error for ``model.residual.<name>`` that ``family`` does not declare."""
    known = ", ".join(types) or "(none)"
    return ConfigError(f"{SECTION}.{name}: {family} has no field {name}; its fields: {known}")


def coerce(name: str, value: Any, kind: type) -> Any:
    """``value`` as a field of type ``kind``: an int passes as a float, nothing
    else changes type (a bool is not an int)."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not kind:
        raise ConfigError(f"{SECTION}.{name}: expected {kind.__name__}, got {value!r}")
    return value


def check_number(field: str, value: Any, lo: float, hi: float = math.inf, *, meaning: str = "",
                 integer: bool = False, exclusive: bool = False) -> float:
    """``value`` of ``model.residual.<field>`` must be a finite number in [lo, hi]
    (``(lo, hi]`` with ``exclusive``)."""
    kind = "an integer" if integer else "a number"
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (lo < value if exclusive else lo <= value) and value <= hi
          and (not integer or float(value).is_integer()))
    if not ok:
        low = f"> {lo:g}" if exclusive else f">= {lo:g}"
        span = low if hi == math.inf else f"in {'(' if exclusive else '['}{lo:g}, {hi:g}]"
        note = f" ({meaning})" if meaning else ""
        raise ConfigError(f"{SECTION}.{field}: must be {kind} {span}{note}, got {value!r}")
    return float(value)


def check_choice(field: str, value: Any, allowed: Iterable[str]) -> str:
    """``value`` of ``model.residual.<field>`` must be one of ``allowed``."""
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(f"{SECTION}.{field}: {value!r} is not one of {', '.join(allowed)}")
    return value
