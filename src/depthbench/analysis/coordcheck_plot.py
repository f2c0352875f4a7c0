"""The coordinate check's figure: one row per family, flat lines where sizes transfer.

Columns, as the grid allows: every depth state's RMS after the last step
against ``l / L``; the final state's RMS and move against depth (widest
width) and against width (deepest depth), a line per step.  Log-log axes, so
a flat line is a slope of 0 in the table (docs/COORDCHECK.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from depthbench.analysis.coordcheck import CoordCheck, Point, fmt_slope
from depthbench.analysis.plots import DPI
from depthbench.plots import save_figure


def _steps_axis(ax, points: list[Point], x_of, moved: bool, xlabel: str) -> None:
    """RMS of ``z_L`` (or its move) at each step against ``x_of(point)``."""
    points = sorted(points, key=x_of)
    steps = len(points[0].state_rms)
    cmap = colormaps["viridis"]
    for t in range(1 if moved else 0, steps):
        ys = [(p.delta_rms if moved else p.state_rms)[t][-1] for p in points]
        ax.plot([x_of(p) for p in points], ys, "o-", ms=3, color=cmap(t / max(steps - 1, 1)),
                label=f"t={t}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.grid(True, which="both", alpha=0.3)


def _blocks_axis(ax, points: list[Point]) -> None:
    """RMS of every depth state after the last step, against ``l / L``."""
    cmap = colormaps["plasma"]
    points = sorted(points, key=lambda p: p.depth)
    for i, p in enumerate(points):
        rms = p.state_rms[-1]
        ax.plot(np.arange(len(rms)) / p.depth, rms, "o-", ms=2,
                color=cmap(i / max(len(points), 1)), label=f"L{p.depth}")
    ax.set_yscale("log")
    ax.set_xlabel("block boundary l / L")
    ax.grid(True, which="both", alpha=0.3)


def draw(check: CoordCheck, path: str | Path) -> Path:
    """The figure of ``check`` as a PNG at ``path``."""
    s = check.settings
    depths, widths, steps = s["depths"], s["widths"], s["steps"]
    columns = ["blocks"]
    if len(depths) > 1:
        columns += ["depth"] + (["depth moved"] if steps else [])
    if len(widths) > 1:
        columns += ["width"] + (["width moved"] if steps else [])
    families = check.families()
    fig = Figure(figsize=(3.3 * len(columns), 2.7 * len(families) + 0.4), layout="constrained")
    axes = fig.subplots(len(families), len(columns), squeeze=False)
    slopes = check.slopes()
    for row, family in zip(axes, families, strict=True):
        points = check.of(family)
        widest = [p for p in points if p.width == max(widths)]
        deepest = [p for p in points if p.depth == max(depths)]
        sl = slopes[family]
        for ax, column in zip(row, columns, strict=True):
            if column == "blocks":
                _blocks_axis(ax, widest)
                ax.set_title(f"{family}: RMS z_l, step {steps}, d{max(widths)}", fontsize=9)
                ax.set_ylabel("RMS")
            elif column.startswith("depth"):
                moved = column.endswith("moved")
                _steps_axis(ax, widest, lambda p: p.depth, moved, "depth L")
                key = "delta_depth_slope" if moved else "depth_slope"
                what = "RMS(z_L(t) - z_L(0))" if moved else "RMS(z_L)"
                ax.set_title(f"{what} d{max(widths)}: slope {fmt_slope(sl[key])}", fontsize=9)
            else:
                moved = column.endswith("moved")
                _steps_axis(ax, deepest, lambda p: p.width, moved, "width d_model")
                key = "delta_width_slope" if moved else "width_slope"
                what = "RMS(z_L(t) - z_L(0))" if moved else "RMS(z_L)"
                ax.set_title(f"{what} L{max(depths)}: slope {fmt_slope(sl[key])}", fontsize=9)
        for ax in row:
            ax.legend(fontsize=6, loc="best")
    fig.suptitle(f"coordinate check: {steps} steps at lr {s['lr']:g} (flat lines transfer)",
                 fontsize=11)
    return save_figure(fig, Path(path), dpi=DPI)
