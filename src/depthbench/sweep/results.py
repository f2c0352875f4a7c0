"""A sweep directory's results: each run's status read from its directory (never
from memory, so any number of sweep processes can share one), results.csv
(rebuilt atomically), the manifest, and the per-run record that keeps a
results table from mixing two recipes under one name."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Sequence
from typing import Any

from etils import epath

from depthbench import run_identity as identity
from depthbench.errors import ConfigError
from depthbench.rundir.io import DamagedFile, atomic_write, atomic_write_json, is_local, read_json
from depthbench.rundir.lock import RunLock
from depthbench.rundir.names import FAILURE_FILE, MANIFEST, RESULT_FILE, RESULTS_CSV, RUN_RECORD
from depthbench.sweep.expand import Run, Sweep

# `depthbench report` appends the equal-compute columns (report.CSV_COLUMNS); a
# sweep rewriting results.csv writes these alone until the next report.
RESULT_COLUMNS = (
    "name", "family", "suite", "depth", "d_model", "aspect_ratio", "lr", "params", "seq_len",
    "steps", "tokens", "final_val_loss", "tokens_per_sec", "mfu", "diverged_at_step",
    "wall_seconds", "status",
)
STATUSES = ("done", "diverged", "failed", "pending", "running", "damaged")
FINISHED = ("done", "diverged")


def read_row(run: Run, run_dir: epath.Path, *, stale_after: float = 600.0) -> dict:
    """The run's results.csv row as its directory says now."""
    row = run.static_row()
    try:
        result = read_json(run_dir / RESULT_FILE)
    except DamagedFile as e:
        row["status"], row["damage"] = "damaged", f"{RESULT_FILE} {e.reason}"
        return row
    if result is not None:
        for key in ("params", "steps", "tokens", "final_val_loss", "tokens_per_sec", "mfu",
                    "diverged_at_step", "wall_seconds"):
            if result.get(key) is not None:
                row[key] = result[key]
        row["status"] = "diverged" if result.get("diverged") else "done"
        return row
    if is_local(run_dir) and RunLock(run_dir, stale_after=stale_after).held_elsewhere():
        row["status"] = "running"
    elif (run_dir / FAILURE_FILE).exists():
        row["status"] = "failed"
    return row


def recorded_run(run_dir: epath.Path) -> Run | None:
    """The Run a sweep recorded in ``run_dir`` (sweep_run.json), if any (a
    damaged record raises :class:`~depthbench.rundir.io.DamagedFile`)."""
    record = read_json(run_dir / RUN_RECORD)
    if record is None or "config" not in record:
        return None
    return Run(int(record.get("index", -1)), str(record.get("name", run_dir.name)),
               tuple(record.get("overrides", {}).items()),
               identity.saved_config(record["config"]))


def other_runs(sweep: Sweep, workdir: epath.Path) -> list[Run]:
    """Runs in ``workdir`` that earlier sweeps (other specs) recorded: a
    directory is the union of the sweeps run into it, so a spec that adds an
    aspect ratio or a family need not repeat the runs already there.  A run
    whose record is damaged is left out (``depthbench report`` names it)."""
    mine = {r.name for r in sweep.runs}
    found = []
    for record in sorted(workdir.glob(f"*/{RUN_RECORD}")):
        if record.parent.name not in mine:
            try:
                run = recorded_run(record.parent)
            except DamagedFile:
                continue
            if run is not None:
                found.append(dataclasses.replace(run, name=record.parent.name))
    return found


def write_results(sweep: Sweep, workdir: epath.Path, *, stale_after: float = 600.0,
                  cache: dict[str, dict] | None = None) -> list[dict]:
    """Rebuild results.csv from the run directories (atomically) and return its rows:
    the sweep's runs in order, then those earlier sweeps left in ``workdir``.
    ``cache`` keeps finished runs' rows between calls."""
    rows = []
    for run in [*sweep.runs, *other_runs(sweep, workdir)]:
        if cache is not None and run.name in cache:
            rows.append(cache[run.name])
            continue
        row = read_row(run, workdir / run.name, stale_after=stale_after)
        if cache is not None and row["status"] in FINISHED:
            cache[run.name] = row
        rows.append(row)
    atomic_write(workdir / RESULTS_CSV, rows_to_csv(rows))
    return rows


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "nan" if math.isnan(value) else str(value)
        return f"{value:.6g}" if abs(value) < 1e-3 or abs(value) >= 1e6 else f"{value:.6f}".rstrip(
            "0").rstrip(".")
    return str(value)


def rows_to_csv(rows: Sequence[dict], columns: Sequence[str] = RESULT_COLUMNS) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_value(row.get(c)) for c in columns])
    return buf.getvalue()


def write_manifest(sweep: Sweep, workdir: epath.Path) -> None:
    manifest = {
        "spec": sweep.spec,
        "cli_overrides": list(sweep.cli_overrides),
        "runs": [{"index": r.index, "name": r.name, "overrides": dict(r.overrides)}
                 for r in sweep.runs],
    }
    atomic_write_json(workdir / MANIFEST, manifest)


def check_recorded(run: Run, run_dir: epath.Path) -> None:
    """Refuse to resume or skip a run that was started with a different config.
    (A damaged record is no evidence either way: the trainer compares the
    run's config.json, and the sweep writes the record again.)"""
    try:
        record = read_json(run_dir / RUN_RECORD)
    except DamagedFile:
        return
    if record is None or "config" not in record:
        return
    changes = [f"{key} {a!r} -> {b!r}"
               for key, a, b in identity.config_changes(record["config"], run.config.to_dict())]
    if changes:
        more = f" (+{len(changes) - 3} more)" if len(changes) > 3 else ""
        raise ConfigError(
            f"run {run.name!r} in {str(run_dir.parent)!r} was started with a different config: "
            f"{'; '.join(changes[:3])}{more}; use a new --workdir or delete {str(run_dir)!r}"
        )


def record_run(run: Run, run_dir: epath.Path) -> None:
    """sweep_run.json: the run's name, index, overrides and full config."""
    record = {"name": run.name, "index": run.index, "overrides": dict(run.overrides),
              "config": run.config.to_dict()}
    atomic_write_json(run_dir / RUN_RECORD, record)
