"""Range checks for ``config.model.residual`` fields (one ConfigError line each)."""

from __future__ import annotations

import math

from depthbench.config import ConfigError


def check_number(config, field: str, lo: float, hi: float = math.inf, *, meaning: str = "",
                 integer: bool = False) -> float:
    """``config.model.residual.<field>`` must be a finite number in [lo, hi]."""
    value = config.model.residual[field]
    kind = "an integer" if integer else "a number"
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and lo <= value <= hi
          and (not integer or float(value).is_integer()))
    if not ok:
        span = f">= {lo:g}" if hi == math.inf else f"in [{lo:g}, {hi:g}]"
        note = f" ({meaning})" if meaning else ""
        raise ConfigError(f"config.model.residual.{field}: must be {kind} {span}{note}, "
                          f"got {value!r}")
    return float(value)
