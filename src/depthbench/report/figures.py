"""The sweep's figures (loss vs aspect ratio, training curves, costs vs aspect
ratio) drawn into its directory by :mod:`depthbench.plots`, and why any was not."""

from __future__ import annotations

from collections.abc import Sequence

from etils import epath

from depthbench import reference
from depthbench.report.summary import FamilyRow

FIGURES = ("loss_vs_aspect", "training_curves", "costs_vs_aspect")  # report.md's order


def draw(workdir: epath.Path, summary: dict[str, list[FamilyRow]], costs_rows: Sequence[dict],
         plots: bool = True) -> dict[str, str | None]:
    """``{figure: its file name}`` for each figure drawn, ``{figure + "_why":
    the reason}`` for each not (all of them when ``plots`` is false)."""
    drawn: dict[str, str | None] = {}
    if not plots:
        for key in FIGURES:
            drawn[key + "_why"] = "--no-plots"
        return drawn
    from depthbench import plots as plotlib

    refs = {suite: reference.points(suite) for suite in summary}
    path = workdir / "loss_vs_aspect.png"
    if plotlib.loss_vs_aspect(summary, refs, path):
        drawn["loss_vs_aspect"] = path.name
    else:
        drawn["loss_vs_aspect_why"] = "no finished runs yet"
    curves = plotlib.load_curves(workdir, summary)
    path = workdir / "training_curves.png"
    if curves and plotlib.training_curves(curves, path):
        drawn["training_curves"] = path.name
    else:
        drawn["training_curves_why"] = "no metrics.jsonl in the best runs' directories"
    path = workdir / "costs_vs_aspect.png"
    if costs_rows and plotlib.costs_vs_aspect(costs_rows, path):
        drawn["costs_vs_aspect"] = path.name
    else:
        drawn["costs_vs_aspect_why"] = "no shape could be costed"
    return drawn
