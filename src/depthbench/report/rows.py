"""A sweep's rows: results.csv, typed, refreshed from run directories that
finished after it was written, and damaged runs marked."""

from __future__ import annotations

import csv
import io
from typing import Any

from etils import epath

from depthbench import sweep as sweeplib
from depthbench.equal_compute import section as equal_compute_section
from depthbench.errors import ConfigError
from depthbench.rundir import damage
from depthbench.rundir.io import as_path
from depthbench.rundir.names import RESULT_FILE, RESULTS_CSV

_INT_COLUMNS = ("depth", "d_model", "params", "seq_len", "steps", "tokens", "diverged_at_step")
_FLOAT_COLUMNS = ("aspect_ratio", "lr", "final_val_loss", "tokens_per_sec", "mfu",
                  "wall_seconds", *equal_compute_section.FLOAT_COLUMNS)


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
