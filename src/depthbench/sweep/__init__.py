"""Sweeps: expand a sweep spec into runs, train them in order, keep results.csv.

A sweep directory holds one subdirectory per run, named from its overrides
(``hc-L8-lr3e-03``), ``sweep.json`` (the expanded sweep) and ``results.csv``
(one row per run, rewritten atomically after every run).  One job per module:

* :mod:`~depthbench.sweep.expand`: a spec into validated runs, and run selection;
* :mod:`~depthbench.sweep.results`: a run's status from its directory,
  results.csv, the manifest and the per-run record;
* :mod:`~depthbench.sweep.execute`: claiming, training and recording runs;
* :mod:`~depthbench.sweep.transfer`: the learning rate tuned at one depth and
  reused at the others (``--transfer-lr-from``), in two phases.

The run directory itself (its file names, lock, atomic writes, identity)
is :mod:`depthbench.rundir`, shared with the trainer and every reader.
"""

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
