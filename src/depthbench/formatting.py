"""How numbers and tables are read and written for people: parameter counts
('400M'), learning rates ('3e-03') and aligned text tables.

The library (reports, sweeps, the trainer) and the command line share these;
nothing here knows about configs, models or runs.
"""

from __future__ import annotations


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
