"""Run names: a run directory's stable, filesystem-safe name from its overrides (a
sweep names its runs with it; a spec may, too)."""

from __future__ import annotations

import math
import re
from typing import Any

from depthbench.formatting import fmt_number

_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def _fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value) and abs(value) < 1e5:
            return str(int(value))
        return fmt_number(value) if math.isfinite(value) else str(value)
    return str(value)


def run_name(overrides: dict[str, Any]) -> str:
    """A stable, filesystem-safe directory name for a run's overrides.

    Family first, then suite (``paper-`` dropped), ``L{depth}``, ``d{d_model}``,
    ``lr{lr}``, then every other field as ``{leaf}{value}`` in key order:
    ``{"model.family": "hc", "model.depth": 8, "train.lr": 0.003}`` ->
    ``hc-L8-lr3e-03``.  A ``name`` override is used as given.
    """
    if "name" in overrides:
        return _SAFE.sub("_", str(overrides["name"])).strip("._") or "run"
    parts = []
    lead = {
        "model.family": lambda v: str(v),
        "model.suite": lambda v: str(v).removeprefix("paper-") or "rule",
        "model.depth": lambda v: f"L{v}",
        "model.d_model": lambda v: f"d{v}",
        "train.lr": lambda v: f"lr{fmt_number(float(v))}",
    }
    for key, fmt in lead.items():
        if key in overrides:
            parts.append(fmt(overrides[key]))
    for key in sorted(k for k in overrides if k not in lead):
        leaf, value = key.rsplit(".", 1)[-1], _fmt_value(overrides[key])
        parts.append(f"{leaf}{value}" if value[:1].isdigit() else f"{leaf}-{value}")
    name = _SAFE.sub("_", "-".join(parts)).strip("._")
    return name or "run"
