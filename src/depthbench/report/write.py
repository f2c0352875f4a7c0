"""A sweep's report written into its directory: report.md, results.csv (with
the equal-compute columns) and the figures; and the report as JSON."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from etils import epath

from depthbench import sweep as sweeplib
from depthbench.equal_compute import section as equal_compute_section
from depthbench.report import figures, finetuned
from depthbench.report.document import markdown
from depthbench.report.rows import load_rows
from depthbench.report.shape_costs import cost_rows, train_flops_per_token
from depthbench.report.summary import FamilyRow, summarize
from depthbench.report.tables import md_table
from depthbench.rundir.io import DamagedFile, as_path, atomic_write, read_json
from depthbench.rundir.names import MANIFEST, REPORT_FILE, RESULTS_CSV

# results.csv as the report writes it: the sweep's columns, then the equal-compute ones.
CSV_COLUMNS = (*sweeplib.RESULT_COLUMNS, *equal_compute_section.COLUMNS)


@dataclasses.dataclass
class Report:
    rows: list[dict]
    summary: dict[str, list[FamilyRow]]
    files: dict[str, str]  # what -> path
    warnings: list[str] = dataclasses.field(default_factory=list)  # one line each
    equal_compute: equal_compute_section.EqualCompute | None = None


def _warnings(workdir: epath.Path, rows: Sequence[dict]) -> list[str]:
    """One line per damaged run, and one for a damaged sweep.json."""
    out = [f"run {r['name']!r}: {r['damage']}; its row is marked damaged"
           for r in rows if r.get("damage")]
    try:
        read_json(workdir / MANIFEST)
    except DamagedFile as e:
        out.append(f"{e} (the sweep's manifest; `depthbench sweep` writes it again)")
    return out


def write_report(workdir: str | epath.Path, *, plots: bool = True) -> Report:
    """report.md, results.csv and the PNG plots into ``workdir``."""
    workdir = as_path(workdir)
    rows = load_rows(workdir)
    summary = summarize(rows)
    costs_rows = cost_rows(workdir, rows)
    files = {"results": str(workdir / RESULTS_CSV)}
    drawn = figures.draw(workdir, summary, costs_rows, plots)
    files.update({k: str(workdir / v) for k, v in drawn.items() if not k.endswith("_why") and v})
    from depthbench.evaluation import report_section

    downstream, downstream_files = report_section.section(workdir, summary, md_table, draw=plots)
    files.update(downstream_files)
    downstream = finetuned.section(workdir, summary, md_table) + downstream
    compute = equal_compute_section.analyse(workdir, rows, summary,
                                            train_flops_per_token(workdir, rows))
    rows = [{**r, **compute.columns[r["name"]]} for r in rows]
    compute_plot, why = None, "--no-plots"
    if plots:
        path = workdir / equal_compute_section.PLOT
        if equal_compute_section.draw(compute, summary, path):
            compute_plot, files["loss_vs_flops"] = path.name, str(path)
        else:
            why = "no finished run has both a curve and a cost"
    compute_lines = equal_compute_section.markdown_lines(compute, rows, summary, md_table,
                                                         compute_plot, why)
    atomic_write(workdir / RESULTS_CSV, sweeplib.rows_to_csv(rows, CSV_COLUMNS))
    text = markdown(str(workdir), rows, summary, costs_rows, drawn, downstream, compute_lines)
    atomic_write(workdir / REPORT_FILE, text)
    files["report"] = str(workdir / REPORT_FILE)
    return Report(rows, summary, files, _warnings(workdir, rows), compute)


def summary_json(report: Report) -> dict:
    """The report as JSON (``depthbench report --json``): each suite's cells and
    best shape per family, the files written, the equal-compute summary."""
    out = {}
    for suite, family_rows in report.summary.items():
        out[suite or "rule"] = {
            fr.family: {
                "cells": [dataclasses.asdict(c) for c in fr.cells],
                "best": dataclasses.asdict(fr.best) if fr.best else None,
            }
            for fr in family_rows
        }
    compute = report.equal_compute
    return {"summary": out, "files": report.files,
            "equal_compute": equal_compute_section.summary_json(compute) if compute else None}
