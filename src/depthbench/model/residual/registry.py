"""The registry of residual families: one line per family.

The shared tests, the trainer, the cost model and the analyses iterate over
this table; adding a family is one new file in this package plus one line here.
"""

from __future__ import annotations

from depthbench.config import ConfigError
from depthbench.model.residual.base import ResidualFamily
from depthbench.model.residual.pre_ln import PreLN

FAMILIES: dict[str, type[ResidualFamily]] = {
    cls.name: cls
    for cls in (
        PreLN,
    )
}


def names() -> list[str]:
    return list(FAMILIES)


def get(name: str) -> type[ResidualFamily]:
    if name not in FAMILIES:
        raise ConfigError(f"config.model.family: {name!r} is not one of {', '.join(FAMILIES)}")
    return FAMILIES[name]
