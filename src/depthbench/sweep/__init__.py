"""Sweeps: expand a sweep spec into runs, train them in order, keep results.csv
(the directory's layout: docs/RUNS.md).  One job per module: expand, results,
execute, transfer; the run directory itself is :mod:`depthbench.rundir`."""

from depthbench.sweep.execute import SweepOutcome, default_runner, run_sweep
from depthbench.sweep.expand import Run, Sweep, expand, parse_shard
from depthbench.sweep.results import (
    FINISHED,
    RESULT_COLUMNS,
    STATUSES,
    check_recorded,
    other_runs,
    read_row,
    recorded_run,
    rows_to_csv,
    write_results,
)

__all__ = [
    "FINISHED", "RESULT_COLUMNS", "STATUSES", "Run", "Sweep", "SweepOutcome", "check_recorded",
    "default_runner", "expand", "other_runs", "parse_shard", "read_row", "recorded_run",
    "rows_to_csv", "run_sweep", "write_results",
]
