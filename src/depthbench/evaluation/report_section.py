"""The report's downstream section: evaluation results per family and aspect ratio.

For every sweep suite, family and depth the report already picks one run
(the best learning rate's).  When that run has ``RUN_DIR/eval/<suite>.json``
files, this module tabulates them, one table per evaluation suite, with the
same columns (aspect ratios) as the loss table:

* ``nll-code-stem-math``: completion-only ``nll_mean`` (nats per target
  token; lower is better) over all six tasks and per category;
* lm-eval suites (``commonsense``, ``bbh-reasoning``, ``--tasks``): the mean
  over tasks of ``acc`` (higher is better; each task's own ``acc,none``).

and draws ``downstream_vs_aspect.png`` (one panel per evaluation suite, one
line per family).  With no evaluated run it adds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from etils import epath

from depthbench.rundir.io import DamagedFile, read_json
from depthbench.rundir.names import EVAL_DIR

PLOT = "downstream_vs_aspect.png"
NLL_ROWS = ("all", "coding", "stem", "math")


def metrics_of(result: dict) -> dict[str, float]:
    """The numbers a report shows for one eval JSON (see the module docstring)."""
    if "aggregate" in result:
        out = {"all": result["aggregate"].get("nll_mean")}
        out.update({c: r.get("nll_mean") for c, r in result.get("categories", {}).items()})
        return {k: v for k, v in out.items() if isinstance(v, (int, float))}
    accs = [m.get("acc,none") for m in result.get("tasks", {}).values()]
    accs = [a for a in accs if isinstance(a, (int, float))]
    return {"mean acc": sum(accs) / len(accs)} if accs else {}


def collect(workdir: epath.Path, summary: dict) -> dict:
    """{eval suite: {sweep suite: {family: {depth: (aspect ratio, metrics)}}}}."""
    out: dict = {}
    for suite, family_rows in summary.items():
        for fr in family_rows:
            for cell in fr.cells:
                if not cell.name:
                    continue
                eval_dir = epath.Path(workdir) / cell.name / EVAL_DIR
                if not eval_dir.exists():
                    continue
                for path in sorted(eval_dir.glob("*.json")):
                    try:
                        result = read_json(path)
                    except DamagedFile:
                        continue  # a damaged eval record is not shown
                    metrics = metrics_of(result)
                    if metrics:
                        out.setdefault(path.stem, {}).setdefault(suite, {}).setdefault(
                            fr.family, {})[cell.depth] = (cell.aspect_ratio, metrics)
    return out


def tables(collected: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, rows) per (eval suite, sweep suite)."""
    out = []
    for eval_suite, by_suite in collected.items():
        for suite, families in by_suite.items():
            depths = sorted({d for fam in families.values() for d in fam})
            ars = {d: ar for fam in families.values() for d, (ar, _) in fam.items()}
            keys = NLL_ROWS if eval_suite.startswith("nll") else ("mean acc",)
            headers = ["family", "metric"] + [f"{ars[d]:.3g} (L{d})" for d in depths]
            rows = []
            for family, by_depth in families.items():
                for key in keys:
                    vals = [by_depth.get(d, (None, {}))[1].get(key) for d in depths]
                    if all(v is None for v in vals):
                        continue
                    best = _best(vals, lower=eval_suite.startswith("nll"))
                    rows.append([family, key] + [
                        "-" if v is None else (f"**{v:.4f}**" if i == best else f"{v:.4f}")
                        for i, v in enumerate(vals)])
            title = f"`{eval_suite}`, {'suite `' + suite + '`' if suite else 'shape rule'}"
            out.append((title, headers, rows))
    return out


def _best(vals: Sequence[float | None], lower: bool) -> int | None:
    ok = [(v if lower else -v, i) for i, v in enumerate(vals)
          if v is not None and math.isfinite(v)]
    return min(ok)[1] if len(ok) > 1 else None


def plot(collected: dict, path: epath.Path) -> bool:
    """One panel per evaluation suite: its headline metric vs aspect ratio per family."""
    from depthbench import plots as plotlib

    panels = [(s, by) for s, by in collected.items() if by]
    if not panels:
        return False
    fig = plotlib.Figure(figsize=(5.2 * len(panels), 4.0))
    families = sorted({f for _, by in panels for fams in by.values() for f in fams})
    colors = plotlib._colors(families)
    for k, (eval_suite, by_suite) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        key = "all" if eval_suite.startswith("nll") else "mean acc"
        all_ars = []
        for suite, fams in by_suite.items():
            for family, by_depth in fams.items():
                pts = sorted((ar, m[key]) for ar, m in by_depth.values() if key in m)
                if pts:
                    all_ars += [a for a, _ in pts]
                    ax.plot(*zip(*pts, strict=True), marker="o", color=colors[family],
                            label=family if len(by_suite) == 1 else f"{family} ({suite})")
        plotlib._aspect_axis(ax, all_ars)
        ax.set_ylabel("completion nll_mean (nats/token, lower is better)"
                      if key == "all" else "mean accuracy (higher is better)")
        ax.set_title(eval_suite)
        ax.legend(fontsize=7)
    plotlib.save_figure(fig, path)
    return True


def section(workdir: epath.Path, summary: dict, md_table, *, draw: bool = True
            ) -> tuple[list[str], dict[str, str]]:
    """(markdown lines, {what: path}) of the downstream section; empty when nothing
    was evaluated.  ``md_table(headers, rows, align)`` renders a table (the report's)."""
    collected = collect(workdir, summary)
    if not collected:
        return [], {}
    lines = ["## Downstream evaluation", "",
             "Runs evaluated with `depthbench eval` (docs/EVAL.md), at each shape's best "
             "learning rate.  `nll-code-stem-math`: completion-only NLL (nats per target "
             "token, lower is better; **bold** the family's best shape); lm-eval suites: mean "
             "accuracy over the suite's tasks (higher is better).", ""]
    for title, headers, rows in tables(collected):
        lines += [f"### {title}", "", md_table(headers, rows, align="ll"), ""]
    files = {}
    if draw and plot(collected, epath.Path(workdir) / PLOT):
        caption = "Downstream metrics vs aspect ratio (best learning rate per shape)"
        lines += [f"![{caption}]({PLOT})", "", f"*{caption}.*", ""]
        files["downstream"] = str(epath.Path(workdir) / PLOT)
    return lines, files
