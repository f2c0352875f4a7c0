"""The laptop depth suite's tables and figure: validation loss by aspect ratio at
equal tokens and at equal training FLOPs (experiments/micro_depth.py).

    python -m bench.micro_depth_report runs/micro_depth --png docs/micro_depth.png

prints the Markdown of bench/results/micro_depth.md's tables.  Equal tokens is
``depthbench report``'s table (each shape's best learning rate by final
validation loss).  Equal FLOPs charges each run its training FLOPs (the cost
model's forward + backward per token, family extras included: ``result.json``'s
``flops_per_token``, times the tokens seen) and reads every run's validation
curve at the budget the cheapest run reached: the loss there, interpolated
linearly in log FLOPs between the two evaluations around it (each shape's best
learning rate again).  The figure has both, loss against aspect ratio, and the
validation curves against FLOPs.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from depthbench import report
from depthbench.rundir.io import finite, read_json, read_jsonl
from depthbench.rundir.names import METRICS_FILE, RESULT_FILE


def val_curve(run_dir: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """``(training FLOPs, validation loss)`` at each evaluation of a finished run."""
    result = read_json(run_dir / RESULT_FILE)
    if not result or not finite(result.get("flops_per_token")):
        return None
    points = [(r["tokens"] * result["flops_per_token"], r["val_loss"])
              for r in read_jsonl(run_dir / METRICS_FILE)
              if finite(r.get("val_loss")) and finite(r.get("tokens"))]
    if not points:
        return None
    flops, loss = map(np.asarray, zip(*sorted(points), strict=True))
    return flops, loss


def loss_at(curve: tuple[np.ndarray, np.ndarray], budget: float) -> float | None:
    """The curve's loss at ``budget`` FLOPs (linear in log FLOPs), None outside it."""
    flops, loss = curve
    if budget < flops[0] or budget > flops[-1]:
        return None
    return float(np.interp(math.log(budget), np.log(flops), loss))


def equal_flops(workdir: Path, rows: list[dict]) -> tuple[float, dict]:
    """The common budget and ``{(family, depth): (loss, lr)}`` at it (best lr)."""
    curves = {r["name"]: val_curve(workdir / r["name"]) for r in rows
              if report.shown_status(r) == "done"}
    curves = {k: v for k, v in curves.items() if v is not None}
    budget = min(c[0][-1] for c in curves.values())
    best: dict[tuple[str, int], tuple[float, float]] = {}
    for r in rows:
        curve = curves.get(r["name"])
        loss = None if curve is None else loss_at(curve, budget)
        key = (r["family"], int(r["depth"]))
        if loss is not None and (key not in best or loss < best[key][0]):
            best[key] = (loss, float(r["lr"]))
    return budget, best


def flops_table(summary: dict, best: dict) -> tuple[list[str], list[list[str]]]:
    """Loss at the common FLOP budget per family and shape; best shape in bold."""
    rows_out = []
    headers = None
    for family_rows in summary.values():
        for fr in family_rows:
            cells = [(c, best.get((fr.family, c.depth))) for c in fr.cells]
            headers = headers or ["family"] + [f"AR {c.aspect_ratio:.1f} (L{c.depth})"
                                               for c, _ in cells] + ["best AR", "best loss"]
            found = [(c, v) for c, v in cells if v is not None]
            top = min(found, key=lambda cv: cv[1][0]) if found else None
            line = [fr.family]
            for c, v in cells:
                text = "-" if v is None else f"{v[0]:.4f}"
                line.append(f"**{text}**" if top is not None and c is top[0] else text)
            line += ([f"{top[0].aspect_ratio:.1f}", f"{top[1][0]:.4f}"] if top else ["-", "-"])
            rows_out.append(line)
    return headers or ["family"], rows_out


def draw(summary: dict, best: dict, curves: list[dict], flops_of: dict, path: Path) -> None:
    """Loss vs aspect ratio at equal tokens and equal FLOPs, and the curves vs FLOPs."""
    from matplotlib import colormaps

    families = [fr.family for rows in summary.values() for fr in rows]
    colors = {f: colormaps["tab10"](i % 10) for i, f in enumerate(families)}
    fig = Figure(figsize=(15, 4.3), layout="constrained")
    tokens_ax, flops_ax, curve_ax = fig.subplots(1, 3)
    for rows in summary.values():
        for fr in rows:
            ok = [c for c in fr.cells if c.loss is not None]
            tokens_ax.plot([c.aspect_ratio for c in ok], [c.loss for c in ok], "o-",
                           color=colors[fr.family], label=fr.family)
            if fr.best is not None:
                tokens_ax.plot(fr.best.aspect_ratio, fr.best.loss, "*", ms=14,
                               color=colors[fr.family])
            at = [(c.aspect_ratio, best[(fr.family, c.depth)][0]) for c in fr.cells
                  if (fr.family, c.depth) in best]
            if at:
                flops_ax.plot(*zip(*at, strict=True), "o-", color=colors[fr.family],
                              label=fr.family)
                flops_ax.plot(*min(at, key=lambda p: p[1]), "*", ms=14, color=colors[fr.family])
    for c in curves:
        fpt = flops_of.get(c["name"])
        if fpt is None or not c["val_step"]:
            continue
        tokens_per_step = c["tokens_per_step"]
        x = [s * tokens_per_step * fpt for s in c["val_step"]]
        curve_ax.plot(x, c["val_loss"], "o-", ms=2, lw=1, color=colors[c["family"]],
                      alpha=0.35 + 0.65 * c["rank"], label=f"{c['family']} L{c['depth']}")
    for ax, title in ((tokens_ax, "equal tokens"), (flops_ax, "equal training FLOPs")):
        ax.set_xscale("log")
        ax.set_xlabel("aspect ratio d_model / L (log)")
        ax.set_ylabel("validation loss (best lr per shape)")
        ax.set_title(f"{title}; star: best shape")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    curve_ax.set_xscale("log")
    curve_ax.set_xlabel("training FLOPs (log)")
    curve_ax.set_ylabel("validation loss")
    curve_ax.set_title("validation curves (darker: deeper)")
    curve_ax.grid(True, alpha=0.3)
    curve_ax.legend(fontsize=5, ncol=2)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--png", type=Path, help="write the figure here")
    args = parser.parse_args(argv)
    from depthbench import plots

    rows = report.load_rows(args.workdir)
    summary = report.summarize(rows)
    budget, best = equal_flops(args.workdir, rows)
    out = sys.stdout
    for suite, family_rows in summary.items():
        out.write(f"Equal tokens (suite `{suite or 'shape rule'}`; each shape's best learning "
                  "rate; **bold**: the family's best aspect ratio):\n\n")
        out.write(report._md_table(*report.loss_table(family_rows), align="l") + "\n\n")
    out.write(f"Equal training FLOPs ({budget:.3g}, the cheapest run's total; each run's "
              "validation curve read there):\n\n")
    out.write(report._md_table(*flops_table(summary, best), align="l") + "\n")
    if args.png is not None:
        curves = plots.load_curves(args.workdir, summary)
        flops_of, by_family = {}, {}
        for c in curves:
            result = read_json(args.workdir / c["name"] / RESULT_FILE) or {}
            flops_of[c["name"]] = result.get("flops_per_token")
            c["tokens_per_step"] = result["tokens"] / result["steps"]
            by_family.setdefault(c["family"], []).append(c)
        for group in by_family.values():  # deeper shapes drawn darker
            depths = sorted({c["depth"] for c in group})
            for c in group:
                c["rank"] = depths.index(c["depth"]) / max(len(depths) - 1, 1)
        draw(summary, best, curves, flops_of, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
