"""Training a sweep's runs in order: claim, train, record, go on.  Finished runs
are skipped, interrupted ones resumed, diverged ones recorded, failures kept
in the run's ``failure.txt`` (the next sweep retries them); a signal stops the
sweep once the trainer has checkpointed."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
from etils import epath

from depthbench import faults
from depthbench.errors import ConfigError
from depthbench.parallel import distributed_reason, env_process_index
from depthbench.rundir.io import as_path, atomic_write, is_local
from depthbench.rundir.lock import RunLock
from depthbench.rundir.names import FAILURE_FILE
from depthbench.sweep.expand import Run, Sweep
from depthbench.sweep.results import (
    FINISHED,
    check_recorded,
    read_row,
    record_run,
    write_manifest,
    write_results,
)

Runner = Callable[..., dict]


def default_runner(config: ml_collections.ConfigDict, workdir: str, *, progress: bool = True
                   ) -> dict:
    """The real trainer (imported late: a dry run needs no training stack)."""
    from depthbench.evaluation.after_training import maybe_evaluate
    from depthbench.train.loop import run

    result = run(config, workdir, progress=progress)
    maybe_evaluate(config, workdir, result, progress=progress)  # when config.eval.suites asks
    return result


def _lead_process(after_run: bool) -> bool:
    """Whether this process writes the sweep's shared files: a single process, or
    process 0 of a multi-host job, known from JAX_PROCESS_ID or SLURM_PROCID, or
    from JAX once the trainer initialised it (JAX's backend must not be touched
    before that, so until then the other processes stay silent)."""
    if distributed_reason() is None:
        return True
    index = env_process_index()  # JAX_PROCESS_ID or SLURM_PROCID
    if index is not None:
        return index == 0
    if not after_run:
        return False
    return jax.process_index() == 0


@dataclasses.dataclass
class SweepOutcome:
    """What one sweep process did; ``rows`` is the final results.csv."""

    selected: list[str]
    trained: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    held_elsewhere: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    diverged: list[str] = dataclasses.field(default_factory=list)
    preempted: str | None = None  # the run stopped by SIGTERM/SIGINT (the sweep stopped)
    rows: list[dict] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed and self.preempted is None


def run_sweep(sweep: Sweep, workdir: str | os.PathLike, *, runs: Sequence[Run] | None = None,
              runner: Runner | None = None, lock: bool = True, progress: bool = True,
              stale_after: float = 600.0, log: Callable[[str], None] | None = None
              ) -> SweepOutcome:
    """Train ``runs`` (default: every run of ``sweep``) in order under ``workdir``.
    With ``lock`` each run is claimed with a :class:`RunLock` and runs held by
    another process are retried once at the end; ``lock=False`` is for a
    multi-host job in which every process trains the same run together."""
    workdir = as_path(workdir)
    runs = list(sweep.runs if runs is None else runs)
    outcome = SweepOutcome(selected=[r.name for r in runs])
    sweeper = _Sweeper(sweep, workdir, runner or default_runner,
                       lock=_use_locks(workdir, lock, log), progress=progress,
                       stale_after=stale_after, outcome=outcome)
    sweeper.prepare(runs)
    try:
        deferred = sweeper.train_in_order(runs, retry=False)
        if deferred and not sweeper.outcome.preempted:
            sweeper.train_in_order(deferred, retry=True)
    except BaseException as e:
        sweeper.bar.close()
        try:
            sweeper.refresh()
        except OSError as again:
            if not faults.is_storage_error(again):
                raise
            # A full disk: rewriting results.csv failed too; the first failure is the
            # one to report (the next sweep rewrites the table).
            raise e from None
        raise
    sweeper.bar.close()
    sweeper.refresh()
    return outcome


def _use_locks(workdir: epath.Path, lock: bool, log: Callable[[str], None] | None) -> bool:
    """Whether runs are claimed with a lock: not in a bucket, not by a multi-host job."""
    if lock and not is_local(workdir):
        _say(log, f"note: no run locks on {workdir} (object store); give each sweep process "
                  "its own --shard or use --run")
        return False
    why = distributed_reason()
    if lock and why is not None:
        # Every process of a multi-host job trains the same run: one lock would
        # let one process in and leave the others waiting at the collectives.
        _say(log, f"note: multi-host job ({why}): no run locks; every process trains the "
                  "same runs together (the launchers give each job one --run)")
        return False
    return lock


class _Sweeper:
    """One sweep process's pass over its runs: skip, claim, train, record."""

    def __init__(self, sweep: Sweep, workdir: epath.Path, runner: Runner, *, lock: bool,
                 progress: bool, stale_after: float, outcome: SweepOutcome):
        self.sweep, self.workdir, self.runner = sweep, workdir, runner
        self.lock, self.progress, self.stale_after = lock, progress, stale_after
        self.outcome = outcome
        self.lead = _lead_process(after_run=False)
        self.cache: dict[str, dict] = {}  # rows of finished runs, read once
        self.ran_trainer = False
        self.bar = _NoBar()

    def prepare(self, runs: Sequence[Run]) -> None:
        """The manifest, the runs' recorded configs checked, results.csv, the bar."""
        if self.lead:
            self.workdir.mkdir(parents=True, exist_ok=True)
            write_manifest(self.sweep, self.workdir)
        for run in runs:
            check_recorded(run, self.workdir / run.name)
        if self.lead:
            self.refresh()
        self.bar = _progress_bar(len(runs), self.progress)

    def refresh(self) -> None:
        """Rewrite results.csv (the process that writes shared files only)."""
        if _lead_process(self.ran_trainer):
            self.outcome.rows = write_results(self.sweep, self.workdir,
                                              stale_after=self.stale_after, cache=self.cache)

    def train_in_order(self, queue: Sequence[Run], *, retry: bool) -> list[Run]:
        """Each run of ``queue`` in turn; the runs another process holds (to retry
        at the end; on the retry they are counted as held elsewhere)."""
        deferred = []
        for run in queue:
            status = self.visit(run, retry=retry)
            if status == "held":
                deferred.append(run)
            if status == "preempted":
                break
        return deferred

    def visit(self, run: Run, *, retry: bool) -> str:
        """Skip, defer or train one run; its status ("held": another process has it)."""
        run_dir = self.workdir / run.name
        status = read_row(run, run_dir, stale_after=self.stale_after)["status"]
        if status in FINISHED:
            self.outcome.skipped.append(run.name)
            if status == "diverged":
                self.outcome.diverged.append(run.name)
            elif self.finetune(run, run_dir, claimed=False) == "preempted":
                return "preempted"
            self.bar.update(1)
            return status
        run_dir.mkdir(parents=True, exist_ok=True)
        claim = RunLock(run_dir, stale_after=self.stale_after) if self.lock else None
        if claim is not None and not claim.acquire():
            if not retry:
                return "held"
            self.outcome.held_elsewhere.append(run.name)
            self.bar.update(1)
            return "held elsewhere"
        try:
            self.bar.set_postfix_str(run.name)
            status = _train_one(run, run_dir, self.runner, self.progress, self.outcome,
                                self.bar, self.lead)
            self.ran_trainer = True
            if status == "done":
                status = self.finetune(run, run_dir, claimed=True) or status
        finally:
            if claim is not None:
                claim.release()
        self.bar.update(1)
        self.refresh()
        return status


    def finetune(self, run: Run, run_dir: epath.Path, *, claimed: bool) -> str | None:
        """Fine-tune and evaluate a finished run when its spec sets ``finetune.records``
        (:mod:`~depthbench.sweep.finetune_hook`); "preempted" when a signal stopped
        the fine-tuning (the sweep stops: re-running it resumes), else None.  A run
        another process holds is left to it."""
        from depthbench.sweep import finetune_hook

        if not finetune_hook.pending(run.config, run_dir):
            return None
        claim = None if claimed or not self.lock else RunLock(run_dir,
                                                              stale_after=self.stale_after)
        if claim is not None and not claim.acquire():
            return None
        try:
            self.bar.set_postfix_str(f"{run.name} (fine-tuning)")
            result = finetune_hook.after_run(run.config, run_dir, self.bar.write,
                                             progress=self.progress)
        finally:
            if claim is not None:
                claim.release()
        if result and result.get("status") == "preempted":
            self.outcome.preempted = run.name
            self.bar.write(f"{run.name}: fine-tuning stopped at step {result.get('step')} "
                           "(signal); re-run the sweep to resume it")
            return "preempted"
        return None


def _failed(run: Run, run_dir: epath.Path, outcome: SweepOutcome, bar, start: float,
            e: Exception) -> str:
    """Record a run whose trainer raised (its traceback in failure.txt); the sweep goes on."""
    tb = traceback.format_exc()
    if _lead_process(after_run=True):
        atomic_write(run_dir / FAILURE_FILE, tb)
    outcome.failed.append(run.name)
    bar.write(f"{run.name}: FAILED after {time.time() - start:.0f} s: "
              f"{type(e).__name__}: {e} (traceback in {run_dir / FAILURE_FILE})")
    return "failed"


def _train_one(run: Run, run_dir: epath.Path, runner: Runner, progress: bool,
               outcome: SweepOutcome, bar, lead: bool) -> str:
    """Train one claimed run; returns its status (done, diverged or failed)."""
    if lead:
        record_run(run, run_dir)
    start = time.time()
    try:
        result = runner(run.config, str(run_dir), progress=progress)
    except ConfigError:
        raise  # bad input (data paths, a changed config): one line, exit 2, for every run alike
    except OSError as e:
        if faults.is_storage_error(e):
            raise  # a full disk fails every run alike: one line, exit 4, re-run to resume
        return _failed(run, run_dir, outcome, bar, start, e)
    except Exception as e:  # recorded, and the sweep goes on
        return _failed(run, run_dir, outcome, bar, start, e)
    if result.get("status") == "preempted":
        # SIGTERM/SIGINT reached the trainer: it checkpointed; stop the whole sweep.
        outcome.preempted = run.name
        bar.write(f"{run.name}: stopped at step {result.get('step')} (signal); re-run the "
                  "sweep to resume it")
        return "preempted"
    if _lead_process(after_run=True):
        if not lead:
            record_run(run, run_dir)
        if (run_dir / FAILURE_FILE).exists():
            (run_dir / FAILURE_FILE).unlink()
    outcome.trained.append(run.name)
    if result.get("diverged"):
        outcome.diverged.append(run.name)
        bar.write(f"{run.name}: diverged at step {result.get('diverged_at_step')}")
        return "diverged"
    loss = result.get("final_val_loss")
    tps = result.get("tokens_per_sec")
    bar.write(f"{run.name}: done  val_loss {_fmt(loss, '.4f')}  "
              f"{_fmt(tps, ',.0f')} tok/s  {time.time() - start:.0f} s")
    if _lead_process(after_run=True):
        from depthbench.analysis.sweep_hook import after_run  # config.analysis.enabled

        after_run(run.config, run_dir, bar.write, progress)
    return "done"


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _say(log: Callable[[str], None] | None, text: str) -> None:
    (log or (lambda s: print(s, file=sys.stderr)))(text)


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix_str(self, s: str) -> None: ...
    def close(self) -> None: ...
    def write(self, s: str) -> None:
        print(s, file=sys.stderr)


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    class _Bar(tqdm):
        def write(self, s: str) -> None:  # type: ignore[override]
            tqdm.write(s, file=sys.stderr)

    return _Bar(total=total, desc="sweep", unit="run", position=0, leave=True, file=sys.stderr,
                dynamic_ncols=True)
