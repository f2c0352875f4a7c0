"""`depthbench sweep`: train every run of a sweep spec into one directory."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys

from depthbench import sweep as sweeplib
from depthbench.cli.validators import directory, positive_int
from depthbench.errors import ConfigError
from depthbench.formatting import fmt_count, fmt_lr, table
from depthbench.rundir.io import as_path
from depthbench.rundir.names import RESULTS_CSV

EPILOG = """\
examples:
  depthbench sweep --config quickstart --workdir runs/quickstart
  depthbench sweep --config quickstart --workdir runs/qs --dry-run
  depthbench sweep --config micro_all --workdir runs/micro --shard 1/4
  depthbench sweep --config paper_400m --workdir gs://BUCKET/400m \\
      --run hc-L32-lr2e-03 --no-lock --config.data.paths='/data/tok/*.npy'

Runs are subdirectories named from their overrides (family, suite, L<depth>,
lr<lr>, ...); DIR/results.csv has one row per run and is rewritten after each.
Re-running the same command skips finished runs, resumes interrupted ones
from their checkpoints and retries failed ones; diverged runs stay recorded.

Several processes may share DIR: --shard i/N takes every N-th run (index
mod N == i), so N machines split a sweep without talking to each other, and
a lock per run (DIR/RUN/run.lock) keeps two processes from training the
same run; a run locked by another process is skipped and looked at again at
the end.  A multi-host job (TPU slice, SLURM nodes) trains ONE run with
every process: give each process the same `--run NAME --no-lock` command
(launch/tpu_sweep.sh and launch/gpu_sweep.sh do; locks are also dropped when
the environment shows several processes); process 0 writes the files.
Locks need a POSIX filesystem (local disk, NFS); on gs:// split work with
--shard or --run instead.

--config.section.field=value overrides apply to every run; a field that the
sweep varies cannot be overridden (select runs with --run instead).

--transfer-lr-from L tunes the learning rate at depth L and reuses it: phase 1
trains every rate of the grid at L, phase 2 only each family's best rate at the
other depths (the grid's own runs; re-running skips finished ones and starts
phase 2 of a family once its phase 1 is finished).  --dry-run shows the phases
and how many runs they save (paper_400m tuned at L16: 100 of 280).
"""


def _indices(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(
            f"--only: expected comma-separated run indices like 0,5, got {text!r}") from None


def _print_runs(rows: list[dict], runs: list[sweeplib.Run]) -> None:
    index = {r.name: r.index for r in runs}
    headers = ["#", "name", "family", "L", "d_model", "aspect", "lr", "params", "status",
               "val_loss"]
    body = [[str(index[r["name"]]), r["name"], r["family"], str(r["depth"]), str(r["d_model"]),
             f"{r['aspect_ratio']:.2f}", fmt_lr(r["lr"]),
             fmt_count(r["params"]), r["status"],
             "-" if r["final_val_loss"] is None else f"{r['final_val_loss']:.4f}"]
            for r in rows]
    print(table(headers, body, align="rllrrrrrl"))


def _summary(rows: list[dict]) -> str:
    counts = {s: sum(r["status"] == s for r in rows) for s in sweeplib.STATUSES}
    parts = [f"{n} {s}" for s, n in counts.items() if n]
    return f"{len(rows)} run{'' if len(rows) == 1 else 's'}: {', '.join(parts)}"


MAX_RUNS_ENV = "DEPTHBENCH_MAX_RUNS"


def _max_runs(flag: int | str | None) -> int | None:
    """--max-runs (the parser checks it), else $DEPTHBENCH_MAX_RUNS, else None."""
    text, where = (flag, "--max-runs") if flag is not None else (
        os.environ.get(MAX_RUNS_ENV), f"${MAX_RUNS_ENV}")
    if text is None or not str(text).strip():
        return None
    try:
        return positive_int(str(text))
    except argparse.ArgumentTypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def _at_most(runs: list[sweeplib.Run], workdir, limit: int | None) -> list[sweeplib.Run]:
    """The selected runs with at most ``limit`` unfinished ones (the first, in
    sweep order); finished runs stay so the summary lists them."""
    if limit is None:
        return runs
    kept, todo = [], 0
    for run in runs:
        finished = sweeplib.read_row(run, workdir / run.name)["status"] in sweeplib.FINISHED
        if finished or todo < limit:
            kept.append(run)
            todo += not finished
    left = len(runs) - len(kept)
    if left:
        print(f"sweep: --max-runs {limit}: training {todo} runs; {left} stay pending "
              "(run the same command again to continue)", file=sys.stderr)
    return kept


def _terminate(signum, frame) -> None:  # noqa: ARG001
    # SIGTERM (preemption, scancel) unwinds like Ctrl-C: locks are released,
    # results.csv is rewritten, the trainer's checkpoints stay for the resume.
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _sigterm_unwinds():
    """:func:`_terminate` as the SIGTERM handler while the sweep runs, the previous
    one restored after (``main()`` called from Python leaves the process as it was)."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    shard = sweeplib.parse_shard(args.shard)
    sweep = sweeplib.expand(args.config, args.overrides)
    names = [n for part in (args.run or []) for n in part.split(",") if n.strip()]
    runs = sweep.select(shard=shard, names=names, indices=_indices(args.only))
    workdir = as_path(args.workdir)
    plan = _transfer_plan(args, sweep, workdir)
    if plan is not None and not (args.list or args.dry_run):
        return _run_transfer(args, plan, runs, workdir)
    if plan is not None:  # list or show the phases planned so far
        planned = {r.name for r in plan.runs()}
        runs = [r for r in runs if r.name in planned]
    from depthbench import dryrun

    if args.list:
        # The runs may read their files on other hosts: check what holds anywhere.
        dryrun.check_data([r.config for r in runs], files=False)
        for run in runs:
            print(run.name)
        return 0
    if args.dry_run:
        _max_runs(args.max_runs)  # $DEPTHBENCH_MAX_RUNS checked as the sweep would
        problems = dryrun.run_problems([r.config for r in runs])
        rows = [sweeplib.read_row(r, workdir / r.name) for r in runs]
        if args.json:
            json.dump([dict(r, index=run.index, overrides=dict(run.overrides))
                       for r, run in zip(rows, runs, strict=True)], sys.stdout, indent=1)
            sys.stdout.write("\n")
            return 0
        where = f"shard {shard[0]}/{shard[1]} of " if shard[1] > 1 else ""
        print(f"{args.config}: {where}{len(sweep.runs)} runs -> {workdir}")
        _print_runs(rows, runs)
        print(_summary(rows) + " (dry run: nothing trained)")
        for problem in problems:  # what would stop the runs: one line each, exit status 2
            print(f"depthbench: error: {problem}", file=sys.stderr)
        return 2 if problems else 0
    limit = _max_runs(args.max_runs)
    dryrun.check_startup([r.config for r in runs])  # before the sweep writes anything
    runs = _at_most(runs, workdir, limit)
    with _sigterm_unwinds():
        outcome = sweeplib.run_sweep(sweep, workdir, runs=runs, lock=not args.no_lock,
                                     progress=not args.no_progress)
    return _report(args, outcome, runs, workdir)


def _report(args: argparse.Namespace, outcome: sweeplib.SweepOutcome, runs, workdir) -> int:
    """Print a finished sweep's rows (or --json) and return its exit status."""
    mine = [r for r in outcome.rows if r["name"] in set(outcome.selected)]
    if args.json:
        json.dump({"results": mine, "failed": outcome.failed,
                   "held_elsewhere": outcome.held_elsewhere}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif mine:
        _print_runs(mine, runs)
        print(_summary(mine) + f"; results: {workdir / RESULTS_CSV}")
    if outcome.held_elsewhere:
        print(f"{len(outcome.held_elsewhere)} runs are being trained by another sweep process: "
              f"{', '.join(outcome.held_elsewhere[:5])}", file=sys.stderr)
    return 0 if outcome.ok else 1


def _transfer_plan(args: argparse.Namespace, sweep, workdir):
    """--transfer-lr-from L: the two phases as the run directories stand (or None)."""
    if args.transfer_lr_from is None:
        return None
    from depthbench.sweep import transfer

    text = str(args.transfer_lr_from).strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--transfer-lr-from: expected a depth of the sweep, got {text!r}")
    plan = transfer.plan(sweep, workdir, int(text))
    print(f"sweep: {plan.summary()}", file=sys.stderr)
    return plan


def _run_transfer(args: argparse.Namespace, plan, runs, workdir) -> int:
    """Phase 1, then phase 2, of this process's runs (depthbench.sweep.transfer)."""
    from depthbench.sweep import transfer

    limit = [_max_runs(args.max_runs)]

    def select(phase) -> list:
        names = {r.name for r in phase}
        chosen = _at_most([r for r in runs if r.name in names], workdir, limit[0])
        if limit[0] is not None:  # --max-runs counts both phases together
            limit[0] = max(limit[0] - sum(sweeplib.read_row(r, workdir / r.name)["status"]
                                          not in sweeplib.FINISHED for r in chosen), 0)
        return chosen

    with _sigterm_unwinds():
        outcome = transfer.run_transfer(plan.sweep, workdir, plan.from_depth, select,
                                        lock=not args.no_lock, progress=not args.no_progress)
    return _report(args, outcome, runs, workdir)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="train every run of a sweep spec (skip finished, resume interrupted)",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, metavar="SPEC",
                        help="a sweep spec file with get_config() and get_sweep()")
    parser.add_argument("--workdir", required=True, metavar="DIR", type=directory,
                        help="the sweep directory (local, NFS or gs://...)")
    parser.add_argument("--shard", metavar="i/N",
                        help="run only runs with index mod N == i (0 <= i < N)")
    parser.add_argument("--run", action="append", metavar="NAME",
                        help="run only runs with this name (comma-separated; shell patterns "
                             "like 'hc-*' allowed; repeatable)")
    parser.add_argument("--only", metavar="I[,I]",
                        help="run only the runs with these sweep indices (see --dry-run)")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the runs with their shapes and status and check their data "
                             "(exit status 2 if a run could not start); train nothing")
    parser.add_argument("--list", action="store_true",
                        help="print the selected run names, one per line (for scripts)")
    parser.add_argument("--no-lock", action="store_true",
                        help="do not claim runs; for multi-host jobs where every process "
                             "trains the same --run together")
    parser.add_argument("--max-runs", metavar="N", type=positive_int,
                        help="train at most N unfinished runs, then stop (the rest stay pending; "
                             f"default ${MAX_RUNS_ENV}, else all)")
    parser.add_argument("--transfer-lr-from", metavar="L",
                        help="tune the learning rate at depth L only and reuse each family's "
                             "best at the other depths (two phases; see below)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_run, accepts_overrides=True)
