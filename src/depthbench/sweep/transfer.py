"""A sweep that tunes the learning rate at one depth and reuses it at the others
(``depthbench sweep --transfer-lr-from L``; docs/LR_TRANSFER.md).  Both phases
are planned from what the run directories hold, so a re-run skips finished
runs and starts a group's phase 2 once its phase 1 is done."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Sequence

from depthbench.errors import ConfigError
from depthbench.rundir.io import as_path, finite
from depthbench.sweep.execute import SweepOutcome, run_sweep
from depthbench.sweep.expand import Run, Sweep
from depthbench.sweep.results import FINISHED, read_row

SWEPT = ("model.depth", "train.lr")  # what a group varies


def group_of(run: Run) -> Hashable:
    """The run's group: its suite and every override but depth and learning rate."""
    rest = tuple(sorted((k, repr(v)) for k, v in run.overrides if k not in SWEPT))
    return (str(run.config.model.suite), rest)


def count_runs(items: Iterable[tuple[Hashable, int]], from_depth: int | None
               ) -> tuple[int, int]:
    """``(full, planned)`` for runs given as ``(group, depth)``, one item per run:
    the grid's count, and the count with every rate at ``from_depth`` (None: each
    group's shallowest) and one run at each other depth of the group."""
    depths: dict[Hashable, list[int]] = {}
    for group, depth in items:
        depths.setdefault(group, []).append(int(depth))
    full = sum(len(d) for d in depths.values())
    planned = 0
    for ds in depths.values():
        tuned = min(ds) if from_depth is None else from_depth
        planned += ds.count(tuned) + len(set(ds) - {tuned})
    return full, planned


@dataclasses.dataclass(frozen=True)
class Plan:
    """The two phases of a transfer sweep, as the run directories stand now."""

    sweep: Sweep  # the whole grid
    from_depth: int
    phase1: tuple[Run, ...]
    phase2: tuple[Run, ...]  # the groups whose rate is known
    waiting: tuple[str, ...]  # run names whose group's phase 1 is unfinished
    best: dict[Hashable, float | None]  # group -> rate (None: all diverged)

    def runs(self) -> tuple[Run, ...]:
        return self.phase1 + self.phase2

    def restricted(self) -> Sweep:
        """The grid cut to the runs planned so far (their sweep indices kept, so
        ``--shard`` splits the same way)."""
        return dataclasses.replace(self.sweep, runs=tuple(sorted(self.runs(),
                                                                 key=lambda r: r.index)))

    def counts(self) -> tuple[int, int]:
        """``(full, planned)``: the grid's runs and the transfer sweep's."""
        return count_runs(((group_of(r), r.config.model.depth) for r in self.sweep.runs),
                          self.from_depth)

    def summary(self) -> str:
        full, planned = self.counts()
        return (f"learning rate tuned at L{self.from_depth}: phase 1 {len(self.phase1)} runs, "
                f"phase 2 {len(self.phase2)} runs ready, {len(self.waiting)} waiting for "
                f"phase 1; {planned} of the grid's {full} runs ({full - planned} saved)")


def _check(sweep: Sweep, from_depth: int) -> None:
    depths = sorted({int(r.config.model.depth) for r in sweep.runs})
    if from_depth not in depths:
        raise ConfigError(f"--transfer-lr-from: the sweep has no depth {from_depth}; its "
                          f"depths: {', '.join(map(str, depths))}")
    groups: dict[Hashable, set[float]] = {}
    for run in sweep.runs:
        if int(run.config.model.depth) == from_depth:
            groups.setdefault(group_of(run), set()).add(float(run.config.train.lr))
    if not any(len(rates) > 1 for rates in groups.values()):
        raise ConfigError("--transfer-lr-from: the sweep tries one learning rate per shape; "
                          "there is nothing to tune (sweep train.lr in get_sweep())")
    for run in sweep.runs:
        if group_of(run) not in groups:
            raise ConfigError(f"--transfer-lr-from: run {run.name!r} has no runs at depth "
                              f"{from_depth} to take its learning rate from")


def plan(sweep: Sweep, workdir, from_depth: int) -> Plan:
    """The phases of ``sweep`` tuned at ``from_depth``, read from ``workdir``."""
    _check(sweep, from_depth)
    workdir = as_path(workdir)
    phase1 = tuple(r for r in sweep.runs if int(r.config.model.depth) == from_depth)
    rows: dict[Hashable, list[dict]] = {}
    for run in phase1:
        rows.setdefault(group_of(run), []).append(read_row(run, workdir / run.name))
    best: dict[Hashable, float | None] = {}
    for group, found in rows.items():
        if all(r["status"] in FINISHED for r in found):
            ok = [r for r in found if r["status"] == "done" and finite(r["final_val_loss"])]
            best[group] = float(min(ok, key=lambda r: r["final_val_loss"])["lr"]) if ok else None
    phase2, waiting = [], []
    for run in sweep.runs:
        if int(run.config.model.depth) == from_depth:
            continue
        group = group_of(run)
        if group not in best:
            waiting.append(run.name)
        elif best[group] is not None and float(run.config.train.lr) == best[group]:
            phase2.append(run)
    return Plan(sweep, from_depth, phase1, tuple(phase2), tuple(waiting), best)


def _merge(first: SweepOutcome, second: SweepOutcome) -> SweepOutcome:
    fields = ("selected", "trained", "skipped", "held_elsewhere", "failed", "diverged")
    merged = {f: getattr(first, f) + getattr(second, f) for f in fields}
    return SweepOutcome(**merged, preempted=first.preempted or second.preempted,
                        rows=second.rows or first.rows)


def run_transfer(sweep: Sweep, workdir, from_depth: int,
                 select: Callable[[Sequence[Run]], list[Run]] = list, **kwargs) -> SweepOutcome:
    """Phase 1, then phase 2 of every group it settled (``select``: this process's
    share of a phase, e.g. its shard); ``kwargs`` go to :func:`run_sweep`."""
    first_plan = plan(sweep, workdir, from_depth)
    first = run_sweep(first_plan.restricted(), workdir, runs=select(first_plan.phase1),
                      **kwargs)
    if first.preempted:
        return first
    second_plan = plan(sweep, workdir, from_depth)
    second = run_sweep(second_plan.restricted(), workdir, runs=select(second_plan.phase2),
                       **kwargs)
    return _merge(first, second)
