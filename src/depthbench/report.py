"""Turn a sweep directory into tables: per family, loss at each aspect ratio.

For every (suite, family, depth) the best learning rate is the finished,
non-diverged run with the lowest final validation loss; a family's best
aspect ratio is the shape whose best run has the lowest loss.  Sweeps of the
paper-400m suite are set beside the published losses (depthbench.reference).

The tables come from ``results.csv`` (kept by ``depthbench sweep``), with
rows refreshed from run directories that finished after it was written;
``write_report`` renders them as report.md, rewrites results.csv, and draws
the plots of :mod:`depthbench.plots`.

A run whose records are damaged (:mod:`depthbench.rundir.damage`: a
``result.json``, ``config.json``, ``sweep_run.json`` or JSON-lines log that
cannot be read) is never shown from results.csv as if it were whole: its row
is marked damaged (no loss in the tables, the file named in the runs table,
a "Damaged runs" section) and named in one warning (:attr:`Report.warnings`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Sequence
from typing import Any

from etils import epath

from depthbench import reference, shapes, variants
from depthbench import sweep as sweeplib
from depthbench.equal_compute import section as equal_compute_section
from depthbench.errors import ConfigError
from depthbench.formatting import fmt_count, fmt_lr
from depthbench.rundir import damage
from depthbench.rundir.io import DamagedFile, as_path, atomic_write, finite, read_json
from depthbench.rundir.names import MANIFEST, REPORT_FILE, RESULT_FILE, RESULTS_CSV

_INT_COLUMNS = ("depth", "d_model", "params", "seq_len", "steps", "tokens", "diverged_at_step")
_FLOAT_COLUMNS = ("aspect_ratio", "lr", "final_val_loss", "tokens_per_sec", "mfu",
                  "wall_seconds", *equal_compute_section.FLOAT_COLUMNS)
# results.csv as the report writes it: the sweep's columns, then the equal-compute ones.
CSV_COLUMNS = (*sweeplib.RESULT_COLUMNS, *equal_compute_section.COLUMNS)


# --------------------------------------------------------------------- rows


def parse_csv(text: str) -> list[dict]:
    """results.csv text -> typed rows (missing values are None)."""
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        row: dict[str, Any] = dict(raw)
        for key in _INT_COLUMNS:
            if key in row:
                row[key] = int(float(row[key])) if row[key] not in ("", None) else None
        for key in _FLOAT_COLUMNS:
            if key in row:
                row[key] = float(row[key]) if row[key] not in ("", None) else None
        row.setdefault("suite", "")
        row.setdefault("status", "done" if row.get("final_val_loss") is not None else "pending")
        rows.append(row)
    return rows


def load_rows(workdir: str | epath.Path) -> list[dict]:
    """The sweep's rows: results.csv, refreshed from run directories that have
    finished since it was written (e.g. by another sweep process).  A run
    with damaged records keeps its results.csv values but carries
    ``row["damage"]`` (which files, what is wrong), so no table shows them."""
    workdir = as_path(workdir)
    path = workdir / RESULTS_CSV
    if not path.exists():
        raise ConfigError(f"report: {str(path)!r} does not exist; run `depthbench sweep "
                          f"--workdir {workdir}` first")
    try:
        rows = parse_csv(path.read_text())
    except (ValueError, csv.Error) as e:
        raise ConfigError(f"report: {str(path)!r} is not a depthbench results.csv: {e}") from None
    if not rows:
        raise ConfigError(f"report: {str(path)!r} has no runs")
    missing = {"name", "family", "depth", "aspect_ratio", "lr", "final_val_loss"} - set(rows[0])
    if missing:
        raise ConfigError(f"report: {str(path)!r} lacks columns {', '.join(sorted(missing))}")
    out = []
    for row in rows:
        found = damage.damaged_records(workdir / row["name"])
        if found:
            row = {**row, "damage": damage.describe(found)}
        elif row["status"] not in sweeplib.FINISHED:
            run = run_of(workdir / row["name"])
            if run is not None and (workdir / row["name"] / RESULT_FILE).exists():
                row = sweeplib.read_row(run, workdir / row["name"])
        out.append(row)
    return out


def shown_status(row: dict) -> str:
    """A row's status as the report shows it: "damaged" when its records are."""
    return "damaged" if row.get("damage") else row["status"]


def run_of(run_dir: epath.Path) -> sweeplib.Run | None:
    """The sweep Run recorded in a run directory (sweep_run.json), if any."""
    return sweeplib.recorded_run(run_dir)


# ------------------------------------------------------------------ summary


@dataclasses.dataclass(frozen=True)
class Cell:
    """The best run of one (suite, family, depth): its lr and loss, or why none."""

    depth: int
    aspect_ratio: float
    loss: float | None  # None: no finished, finite run
    lr: float | None
    name: str | None
    state: str  # "ok" | "diverged" (every lr) | "pending" | "failed" | "damaged"


@dataclasses.dataclass(frozen=True)
class FamilyRow:
    suite: str
    family: str
    cells: tuple[Cell, ...]  # one per depth of the suite's sweep, deepest last

    @property
    def best(self) -> Cell | None:
        ok = [c for c in self.cells if c.loss is not None]
        return min(ok, key=lambda c: c.loss) if ok else None




def summarize(rows: Sequence[dict]) -> dict[str, list[FamilyRow]]:
    """``{suite: [FamilyRow, ...]}``: per family the best lr per shape, the loss
    at each aspect ratio and the best aspect ratio (families in sweep order)."""
    suites: dict[str, dict[str, dict[int, list[dict]]]] = {}
    ars: dict[str, dict[int, float]] = {}
    for row in rows:
        suite = row.get("suite") or ""
        suites.setdefault(suite, {}).setdefault(row["family"], {}).setdefault(
            int(row["depth"]), []).append(row)
        ars.setdefault(suite, {})[int(row["depth"])] = float(row["aspect_ratio"])
    out: dict[str, list[FamilyRow]] = {}
    for suite, families in suites.items():
        depths = sorted(ars[suite])
        table = []
        for family, by_depth in families.items():
            cells = []
            for depth in depths:
                runs = by_depth.get(depth, [])
                good = [r for r in runs
                        if shown_status(r) == "done" and finite(r["final_val_loss"])]
                if good:
                    best = min(good, key=lambda r: r["final_val_loss"])
                    cells.append(Cell(depth, ars[suite][depth], best["final_val_loss"],
                                      best["lr"], best["name"], "ok"))
                    continue
                if runs and all(shown_status(r) == "diverged" or (
                        shown_status(r) == "done" and not finite(r["final_val_loss"]))
                                for r in runs):
                    state = "diverged"
                elif any(shown_status(r) == "damaged" for r in runs):
                    state = "damaged"
                elif any(shown_status(r) == "failed" for r in runs):
                    state = "failed"
                else:
                    state = "pending"
                cells.append(Cell(depth, ars[suite][depth], None, None, None, state))
            table.append(FamilyRow(suite, family, tuple(cells)))
        out[suite] = table
    return out


# ----------------------------------------------------------------- markdown


def _md_table(headers: Sequence[str], body: Sequence[Sequence[str]], align: str = "") -> str:
    align = align.ljust(len(headers), "r")
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _shape_header(cell: Cell) -> str:
    return f"AR {cell.aspect_ratio:.1f} (L{cell.depth})"


def _cell_text(cell: Cell, best: Cell | None, what: str, bold: bool = True) -> str:
    if cell.loss is None:
        return {"diverged": "diverged", "failed": "failed", "damaged": "damaged"}.get(
            cell.state, "-")
    text = f"{cell.loss:.4f}" if what == "loss" else fmt_lr(cell.lr)
    return f"**{text}**" if bold and best is not None and cell.depth == best.depth else text


def loss_table(family_rows: Sequence[FamilyRow]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: loss at each aspect ratio, best AR and loss per family."""
    headers = ["family"] + [_shape_header(c) for c in family_rows[0].cells] + [
        "best AR", "best loss", "best lr"]
    body = []
    for fr in family_rows:
        best = fr.best
        body.append([fr.family] + [_cell_text(c, best, "loss") for c in fr.cells] + (
            [f"{best.aspect_ratio:.1f}", f"{best.loss:.4f}", fmt_lr(best.lr)]
            if best else ["-", "-", "-"]))
    return headers, body


def lr_table(family_rows: Sequence[FamilyRow]) -> tuple[list[str], list[list[str]]]:
    headers = ["family"] + [_shape_header(c) for c in family_rows[0].cells]
    body = [[fr.family] + [_cell_text(c, None, "lr", bold=False) for c in fr.cells]
            for fr in family_rows]
    return headers, body


def reference_table(suite: str, family_rows: Sequence[FamilyRow]
                    ) -> tuple[list[str], list[list[str]]] | None:
    """Measured vs published loss per shape ("measured / published (delta)")."""
    ref = reference.losses(suite)
    if not ref:
        return None
    depths = sorted({d for by_depth in ref.values() for d in by_depth})
    s = shapes.suite(suite)
    headers = ["family"] + [f"AR {s.shape(d).aspect_ratio:.1f} (L{d})" for d in depths] + [
        "best AR measured", "best AR published"]
    measured = {fr.family: fr for fr in family_rows}
    body = []
    for family, by_depth in ref.items():
        fr = measured.get(family)
        cells = {c.depth: c for c in fr.cells} if fr else {}
        row = [family]
        for d in depths:
            if d not in by_depth:
                row.append("-")
                continue
            c = cells.get(d)
            if c is not None and c.loss is not None:
                row.append(f"{c.loss:.3f} / {by_depth[d]:.3f} ({c.loss - by_depth[d]:+.3f})")
            else:
                row.append(f"- / {by_depth[d]:.3f}")
        best = fr.best if fr else None
        row.append(f"{best.aspect_ratio:.1f}" if best else "-")
        row.append(f"{s.shape(reference.best_depth(suite, family)).aspect_ratio:.1f}")
        body.append(row)
    return headers, body


def _fmt_count(n: float | None) -> str:
    return "-" if n is None else fmt_count(n)


def runs_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    headers = ["run", "family", "L", "AR", "lr", "params", "val loss", "tokens/s", "MFU",
               "status"]
    body = []
    for r in rows:
        if r.get("damage"):  # nothing of a damaged run is shown as measured
            body.append([r["name"], r["family"], str(r["depth"]), f"{r['aspect_ratio']:.1f}",
                         fmt_lr(r["lr"]), "-", "-", "-", "-", "damaged (see below)"])
            continue
        body.append([
            r["name"], r["family"], str(r["depth"]), f"{r['aspect_ratio']:.1f}",
            fmt_lr(r["lr"]), _fmt_count(r.get("params")),
            f"{r['final_val_loss']:.4f}" if finite(r.get("final_val_loss")) else "-",
            f"{r['tokens_per_sec']:,.0f}" if finite(r.get("tokens_per_sec")) else "-",
            f"{100 * r['mfu']:.1f}%" if finite(r.get("mfu")) else "-",
            r["status"] + (f" @{r['diverged_at_step']}" if r.get("diverged_at_step") else ""),
        ])
    return headers, body


def costs_table(cost_rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    headers = ["family", "L", "d_model", "AR", "params", "prefill GFLOPs", "KV cache MiB",
               "state B/token", "T"]
    body = [[c["family"], str(c["depth"]), str(c["d_model"]), f"{c['aspect_ratio']:.1f}",
             _fmt_count(c["params"]), f"{c['prefill_flops'] / 1e9:,.2f}",
             f"{c['kv_cache_bytes'] / 2**20:,.2f}", f"{c['state_bytes_per_token']:,}",
             str(c["seq_len"])] for c in cost_rows]
    return headers, body


def _spec_of(workdir: epath.Path, row: dict):
    """(ModelSpec, seq_len) of a row: its recorded config, else its suite's shape
    at the row's seq_len; None for a damaged run, a rule-made shape with no
    recorded config, or a family this checkout does not know."""
    from depthbench.model.spec import ModelSpec

    run = None if row.get("damage") else run_of(workdir / row["name"])
    try:
        if run is not None:
            return ModelSpec.from_config(run.config), int(run.config.train.seq_len)
        if row.get("suite"):
            shape = shapes.suite(row["suite"]).shape(int(row["depth"]))
            return (ModelSpec.from_shape(shape, family=row["family"]),
                    int(row.get("seq_len") or 2048))
    except (ConfigError, KeyError):
        pass
    return None


def cost_rows(workdir: epath.Path, rows: Sequence[dict]) -> list[dict]:
    """depthbench.costs for every (family, suite, depth) of the sweep, at its seq_len."""
    from depthbench import costs

    seen, out = set(), []
    for r in rows:
        key = (r.get("suite") or "", r["family"], r["depth"])
        if key in seen:
            continue
        found = _spec_of(workdir, r)
        if found is None:
            continue
        spec, seq_len = found
        try:
            row = costs.cost_row(spec, seq_len)
        except (ConfigError, KeyError):
            continue  # a family this checkout does not know
        seen.add(key)
        out.append({**row, "family": r["family"], "suite": key[0], "seq_len": seq_len})
    return out


def train_flops_per_token(workdir: epath.Path, rows: Sequence[dict]) -> dict[str, float]:
    """{run name: the cost model's training FLOPs per token} of every run that
    can be costed (:func:`depthbench.costs.train_flops_per_token`); none for a
    damaged run, whose tokens are not trusted either."""
    from depthbench import costs

    out = {}
    for r in rows:
        found = None if r.get("damage") else _spec_of(workdir, r)
        if found is not None:
            try:
                out[r["name"]] = float(costs.train_flops_per_token(*found))
            except (ConfigError, KeyError):
                continue  # a family this checkout does not know
    return out


def markdown(workdir: str, rows: Sequence[dict], summary: dict[str, list[FamilyRow]],
             costs_rows: Sequence[dict], plots: dict[str, str | None],
             sections: Sequence[str] = (), equal_compute: Sequence[str] = ()) -> str:
    counts = {s: sum(shown_status(r) == s for r in rows) for s in sweeplib.STATUSES}
    status = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    out = [f"# depthbench sweep report: `{workdir}`", "",
           f"{len(rows)} runs: {status}.  Metric: validation loss at the end of training "
           "(nats per token); each cell is the best learning rate's run, **bold** the family's "
           "best aspect ratio (d_model / L).", ""]
    labelled = sorted({r["family"] for r in rows if variants.SEPARATOR in str(r["family"])})
    if labelled:
        out += ["Rows named `family+variant` (" + ", ".join(f"`{f}`" for f in labelled) + ") "
                "train the plain family with the variant's config overrides "
                "(`depthbench.variants`): the difference from the family's own row is the "
                "variant's effect at the same recipe, shapes and seed.", ""]
    for suite, family_rows in summary.items():
        title = f"suite `{suite}`" if suite else "shape rule"
        out += [f"## Validation loss by aspect ratio, {title}", ""]
        out += [_md_table(*loss_table(family_rows), align="l"), ""]
        out += [f"### Best learning rate per shape, {title}", ""]
        out += [_md_table(*lr_table(family_rows), align="l"), ""]
        ref = reference_table(suite, family_rows)
        if ref is not None:
            out += [f"### Measured / published validation loss, {title}", "",
                    f"Published: {reference.SOURCE}.", ""]
            out += [_md_table(*ref, align="l"), ""]
        elif suite.startswith("paper-"):
            out += [f"No published reference losses for `{suite}` "
                    "(only paper-400m has them).", ""]
    out += ["## Plots", ""]
    captions = {
        "loss_vs_aspect": "Validation loss vs aspect ratio (best learning rate per shape; "
                          "star: best shape; dashed: published reference)",
        "training_curves": "Training loss (lines) and validation loss (dots) of each shape's "
                           "best run",
        "costs_vs_aspect": "Prefill FLOPs, KV cache and residual-state memory vs aspect ratio",
    }
    for key, caption in captions.items():
        if plots.get(key):
            out += [f"![{caption}]({plots[key]})", "", f"*{caption}.*", ""]
        else:
            out += [f"*{caption}: not drawn ({plots.get(key + '_why', 'no data')}).*", ""]
    if costs_rows:
        out += ["## Costs per shape (no training needed)", "",
                "Prefill FLOPs per sequence of T tokens (matrix products of the backbone, "
                "causal attention halved; LM head excluded), bf16 KV cache per sequence, "
                "residual-state activation bytes per token (depthbench.costs).", ""]
        out += [_md_table(*costs_table(costs_rows), align="l"), ""]
    out += list(equal_compute)  # the "Loss at equal compute" section's lines
    from depthbench.analysis import report_section  # runs analysed by `depthbench analyze`

    out += report_section.markdown_lines(workdir, rows, _md_table)
    out += list(sections)  # e.g. the downstream evaluation section
    out += ["## All runs", "", _md_table(*runs_table(rows), align="ll"), ""]
    damaged = [r for r in rows if r.get("damage")]
    if damaged:
        out += ["## Damaged runs", "",
                "Their records cannot be read, so none of their values is shown above "
                "(results.csv keeps what it held).", ""]
        out += [f"- `{r['name']}`: {r['damage']}" for r in damaged] + [""]
    return "\n".join(out)


# -------------------------------------------------------------------- write


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
    from depthbench import plots as plotlib

    workdir = as_path(workdir)
    rows = load_rows(workdir)
    summary = summarize(rows)
    costs_rows = cost_rows(workdir, rows)
    files = {"results": str(workdir / RESULTS_CSV)}
    drawn: dict[str, str | None] = {}
    if plots:
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
        files.update({k: str(workdir / v) for k, v in drawn.items()
                      if not k.endswith("_why") and v})
    else:
        for key in ("loss_vs_aspect", "training_curves", "costs_vs_aspect"):
            drawn[key + "_why"] = "--no-plots"
    from depthbench.evaluation import report_section

    downstream, downstream_files = report_section.section(workdir, summary, _md_table,
                                                                  draw=plots)
    files.update(downstream_files)
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
    compute_lines = equal_compute_section.markdown_lines(compute, rows, summary, _md_table,
                                                         compute_plot, why)
    atomic_write(workdir / RESULTS_CSV, sweeplib.rows_to_csv(rows, CSV_COLUMNS))
    text = markdown(str(workdir), rows, summary, costs_rows, drawn, downstream, compute_lines)
    atomic_write(workdir / REPORT_FILE, text)
    files["report"] = str(workdir / REPORT_FILE)
    return Report(rows, summary, files, _warnings(workdir, rows), compute)


def summary_json(report: Report) -> dict:
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


__all__ = ["CSV_COLUMNS", "Cell", "FamilyRow", "Report", "cost_rows", "load_rows", "loss_table",
           "lr_table", "markdown", "parse_csv", "reference_table", "summarize",
           "train_flops_per_token", "write_report"]
