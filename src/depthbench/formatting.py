"""How numbers, names and tables are read and written for people: counts ('400M'),
learning rates ('3e-03'), run names from overrides ('hc-L8-lr3e-03', stable
and filesystem-safe) and aligned text tables.  Nothing here knows about
configs, models or runs."""

from __future__ import annotations

import math
import re
from typing import Any


def parse_count(text: str) -> float:
    """'400M' -> 4e8, '1.6B' -> 1.6e9, '12k' -> 12000, '1e6' -> 1e6 (ValueError otherwise)."""
    text = str(text).strip()
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}
    if text and text[-1].lower() in scale:
        return float(text[:-1]) * scale[text[-1].lower()]
    return float(text)


def fmt_count(n: float) -> str:
    """401234567 -> '401.2M', 1.6e9 -> '1.600B', 1187576 -> '1.19M'."""
    n = float(n)
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            v = n / scale
            digits = 3 if suffix == "B" else (1 if abs(v) >= 10 else 2)
            return f"{v:.{digits}f}{suffix}"
    return f"{n:g}"


def fmt_number(value: float) -> str:
    """The shortest e-notation that reads back exactly: 3e-03, 2.5e-03."""
    for digits in range(0, 16):
        text = f"{value:.{digits}e}"
        if float(text) == value:
            return text
    return repr(value)


def fmt_lr(lr: float | None) -> str:
    """A learning rate as run names write it: 3e-03, 2.5e-03 ('-' if unknown)."""
    return "-" if lr is None else fmt_number(float(lr))


def table(headers: list[str], rows: list[list[str]], align: str = "") -> str:
    """An aligned text table; ``align`` has one 'l' or 'r' per column (default 'r')."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    align = align.ljust(len(headers), "r")

    def line(cells: list[str]) -> str:
        out = [
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(cells, widths, align, strict=True)
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


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
    """A stable, filesystem-safe directory name for a run's overrides: family, suite
    (``paper-`` dropped), ``L{depth}``, ``d{d_model}``, ``lr{lr}``, then every other
    field as ``{leaf}{value}`` in key order (``hc-L8-lr3e-03``); a ``name``
    override is used as given."""
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
