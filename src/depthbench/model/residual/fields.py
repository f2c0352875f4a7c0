"""Checks for ``config.model.residual`` fields (one ConfigError line each).

A family declares its fields and their defaults in its own ``fields`` table
(see ``base.ResidualFamily``) and checks their values in ``validate`` with
these helpers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from depthbench.errors import ConfigError


def check_number(config, field: str, lo: float, hi: float = math.inf, *, meaning: str = "",
                 integer: bool = False, exclusive: bool = False) -> float:
    """``config.model.residual.<field>`` must be a finite number in [lo, hi]
    (``(lo, hi]`` with ``exclusive``)."""
    value = config.model.residual[field]
    kind = "an integer" if integer else "a number"
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (lo < value if exclusive else lo <= value) and value <= hi
          and (not integer or float(value).is_integer()))
    if not ok:
        low = f"> {lo:g}" if exclusive else f">= {lo:g}"
        span = low if hi == math.inf else f"in {'(' if exclusive else '['}{lo:g}, {hi:g}]"
        note = f" ({meaning})" if meaning else ""
        raise ConfigError(f"config.model.residual.{field}: must be {kind} {span}{note}, "
                          f"got {value!r}")
    return float(value)


def check_choice(config, field: str, allowed: Iterable[str]) -> str:
    """``config.model.residual.<field>`` must be one of ``allowed``."""
    value, allowed = config.model.residual[field], list(allowed)
    if value not in allowed:
        raise ConfigError(f"config.model.residual.{field}: {value!r} is not one of "
                          f"{', '.join(allowed)}")
    return value
