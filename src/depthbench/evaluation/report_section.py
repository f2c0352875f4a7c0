"""The report's downstream section: evaluation results per family and aspect ratio.

Tabulates the ``RUN_DIR/eval/<suite>.json`` files of the run the report picks
per (suite, family, depth), one table per evaluation suite with the loss
table's columns, and draws ``downstream_vs_aspect.png``; a run a sweep
fine-tuned has its ``sft/eval/`` scores beside, in a ``stage`` column.
docs/EVAL.md, "In a sweep, in the report, on a cluster"."""

from __future__ import annotations

import math
from collections.abc import Sequence

from etils import epath

from depthbench.rundir.io import DamagedFile, read_json
from depthbench.rundir.names import EVAL_DIR, FINETUNE_DIR

PLOT = "downstream_vs_aspect.png"
NLL_ROWS = ("all", "coding", "stem", "math")
STAGES = {"zero-shot": "", "fine-tuned": FINETUNE_DIR}  # stage -> where its run is


def metrics_of(result: dict) -> dict[str, float]:
    """The numbers a report shows for one eval JSON: the NLL suite's ``nll_mean``
    overall and per category, an lm-eval suite's mean ``acc,none`` over tasks."""
    if "aggregate" in result:
        out = {"all": result["aggregate"].get("nll_mean")}
        out.update({c: r.get("nll_mean") for c, r in result.get("categories", {}).items()})
        return {k: v for k, v in out.items() if isinstance(v, (int, float))}
    accs = [m.get("acc,none") for m in result.get("tasks", {}).values()]
    accs = [a for a in accs if isinstance(a, (int, float))]
    return {"mean acc": sum(accs) / len(accs)} if accs else {}


def collect(workdir: epath.Path, summary: dict, within: str = "") -> dict:
    """{eval suite: {sweep suite: {family: {depth: (aspect ratio, metrics)}}}} of the
    best runs (``within``: of the run each holds there, e.g. its fine-tuning)."""
    out: dict = {}
    for suite, family_rows in summary.items():
        for fr in family_rows:
            for cell in fr.cells:
                if not cell.name:
                    continue
                eval_dir = epath.Path(workdir) / cell.name / within / EVAL_DIR
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


def collect_stages(workdir: epath.Path, summary: dict) -> dict:
    """{stage: collected} for the stages any best run was evaluated at."""
    found = {stage: collect(workdir, summary, within) for stage, within in STAGES.items()}
    return {stage: c for stage, c in found.items() if c}


def _by_depth(staged: dict, eval_suite: str, suite: str, family: str) -> dict:
    return staged.get(eval_suite, {}).get(suite, {}).get(family, {})


def tables(staged: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, rows) per (eval suite, sweep suite); a stage column when
    more than the zero-shot scores are there (``staged``: :func:`collect_stages`)."""
    out, with_stage = [], set(staged) != {"zero-shot"}
    eval_suites = dict.fromkeys(e for c in staged.values() for e in c)
    for eval_suite in eval_suites:
        suites = dict.fromkeys(s for c in staged.values() for s in c.get(eval_suite, {}))
        for suite in suites:
            cells = [c.get(eval_suite, {}).get(suite, {}) for c in staged.values()]
            families = list(dict.fromkeys(f for c in cells for f in c))
            ars = {d: ar for c in cells for fam in c.values() for d, (ar, _) in fam.items()}
            depths = sorted(ars)
            keys = NLL_ROWS if eval_suite.startswith("nll") else ("mean acc",)
            headers = (["family", "metric"] + (["stage"] if with_stage else [])
                       + [f"{ars[d]:.3g} (L{d})" for d in depths])
            rows = []
            for family in families:
                for key in keys:
                    for stage, c in staged.items():
                        by_depth = _by_depth(c, eval_suite, suite, family)
                        vals = [by_depth.get(d, (None, {}))[1].get(key) for d in depths]
                        if all(v is None for v in vals):
                            continue
                        best = _best(vals, lower=eval_suite.startswith("nll"))
                        rows.append([family, key] + ([stage] if with_stage else []) + [
                            "-" if v is None else (f"**{v:.4f}**" if i == best else f"{v:.4f}")
                            for i, v in enumerate(vals)])
            title = f"`{eval_suite}`, {'suite `' + suite + '`' if suite else 'shape rule'}"
            out.append((title, headers, rows))
    return out


def _best(vals: Sequence[float | None], lower: bool) -> int | None:
    ok = [(v if lower else -v, i) for i, v in enumerate(vals)
          if v is not None and math.isfinite(v)]
    return min(ok)[1] if len(ok) > 1 else None


def plot(staged: dict, path: epath.Path) -> bool:
    """One panel per evaluation suite: its headline metric vs aspect ratio per family
    (fine-tuned scores dashed)."""
    from depthbench import plots as plotlib

    names = list(dict.fromkeys(e for c in staged.values() for e, by in c.items() if by))
    if not names:
        return False
    fig = plotlib.Figure(figsize=(5.2 * len(names), 4.0))
    families = sorted({f for c in staged.values() for by in c.values() for fams in by.values()
                       for f in fams})
    colors = plotlib._colors(families)
    for k, eval_suite in enumerate(names):
        ax = fig.add_subplot(1, len(names), k + 1)
        key = "all" if eval_suite.startswith("nll") else "mean acc"
        all_ars = []
        for stage, collected in staged.items():
            by_suite = collected.get(eval_suite, {})
            for suite, fams in by_suite.items():
                for family, by_depth in fams.items():
                    pts = sorted((ar, m[key]) for ar, m in by_depth.values() if key in m)
                    if not pts:
                        continue
                    all_ars += [a for a, _ in pts]
                    label = family if len(by_suite) == 1 else f"{family} ({suite})"
                    if len(staged) > 1:
                        label += f", {stage}"
                    ax.plot(*zip(*pts, strict=True), marker="o", color=colors[family],
                            linestyle="--" if stage == "fine-tuned" else "-", label=label)
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
    staged = collect_stages(workdir, summary)
    if not staged:
        return [], {}
    lines = ["## Downstream evaluation", "",
             "Runs evaluated with `depthbench eval` (docs/EVAL.md), at each shape's best "
             "learning rate.  `nll-code-stem-math`: completion-only NLL (nats per target "
             "token, lower is better; **bold** the family's best shape); lm-eval suites: mean "
             "accuracy over the suite's tasks (higher is better).", ""]
    with_stage = set(staged) != {"zero-shot"}
    if with_stage:
        lines += ["Stage `fine-tuned`: the same run after supervised fine-tuning "
                  "(`RUN_DIR/sft/`, docs/FINETUNE.md), evaluated alike.", ""]
    for title, headers, rows in tables(staged):
        lines += [f"### {title}", "", md_table(headers, rows, align="lll" if with_stage
                                                else "ll"), ""]
    files = {}
    if draw and plot(staged, epath.Path(workdir) / PLOT):
        caption = "Downstream metrics vs aspect ratio (best learning rate per shape)"
        lines += [f"![{caption}]({PLOT})", "", f"*{caption}.*", ""]
        files["downstream"] = str(epath.Path(workdir) / PLOT)
    return lines, files
