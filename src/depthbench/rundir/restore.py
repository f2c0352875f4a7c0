"""Restoring a run's checkpoint: the newest intact step, or the one asked for.

Every reader of checkpoints goes through here: the trainer (full state, data
position and clock: :mod:`depthbench.train.checkpoint`), :func:`read_params`
(the parameters only: ``load_run``, hence analyze, eval, lm-eval and the
notebook) and the run report (which only checks the steps).

A step is intact when it is finished (Orbax lists it), matches its
integrity record (:mod:`~depthbench.rundir.integrity`) and its reader
succeeds.  :func:`newest_intact` walks the steps newest first and returns
the first intact one with the damaged steps it skipped; readers name those
in one warning line.  When steps exist but none is intact it raises
:class:`DamagedCheckpoints` (a ConfigError: one line, exit status 2).
Readers never move or write anything; only the trainer sets damaged steps
aside.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from depthbench import confine
from depthbench.errors import ConfigError
from depthbench.orbax_leftovers import quiet_orbax_leftovers, underlying
from depthbench.rundir.integrity import check_integrity
from depthbench.rundir.names import CHECKPOINT_DIR

T = TypeVar("T")


class DamagedCheckpoints(ConfigError):
    """Checkpoints exist but none of them can be restored."""


def steps_on_disk(directory: Path) -> list[int]:
    """Step directories present, whether or not Orbax can read them (a name of
    ASCII digits only: a step number)."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir()
                  if p.name.isascii() and p.name.isdigit() and len(p.name) < 19 and p.is_dir())


def finished_steps(directory: Path) -> set[int]:
    """Steps Orbax lists as finished (a save in flight or cut short is not)."""
    import orbax.checkpoint as ocp

    return set(ocp.path.step.checkpoint_steps(directory)) if directory.is_dir() else set()


def one_line(e: BaseException) -> str:
    """An exception as one short line (Orbax's messages span many)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text[:200]}"


def step_problem(directory: Path, step: int, finished: set[int]) -> str | None:
    """Why ``step`` cannot be trusted before reading it (None: it can): a step
    is read only if it is a directory of the run's own (not a link out of it)
    that matches its integrity record."""
    if (directory / str(step)).is_symlink():
        return "it is a symbolic link (a reader reads only what the run directory holds)"
    reason = check_integrity(directory / str(step))
    if reason is None and step not in finished:
        reason = "Orbax does not list it as a finished checkpoint"
    return reason


@dataclasses.dataclass(frozen=True)
class Found(Generic[T]):
    """The step restored, what its reader returned, and the newer steps skipped."""

    step: int
    value: T
    skipped: tuple[tuple[int, str], ...]  # (step, why), newest first

    def skipped_text(self) -> str:
        return "; ".join(f"step {s}: {why}" for s, why in self.skipped)


def newest_intact(directory: Path, read: Callable[[int], T] | None = None, *,
                  hint: str) -> Found[T] | None:
    """The newest intact step of ``directory`` and ``read(step)`` (no reader: the
    step is checked, not read); None when there is no step at all.

    Raises :class:`DamagedCheckpoints` (ending in ``hint``: what to do) when
    steps exist but none is intact."""
    on_disk = steps_on_disk(directory)
    if not on_disk:
        return None
    finished = finished_steps(directory)
    skipped: list[tuple[int, str]] = []
    for step in reversed(on_disk):
        reason = step_problem(directory, step, finished)
        value = None
        if reason is None and read is not None:
            value, reason = _try_read(read, step)
        if reason is None:
            return Found(step, value, tuple(skipped))
        skipped.append((step, reason))
    what = "; ".join(f"step {s}: {why}" for s, why in skipped)
    raise DamagedCheckpoints(f"checkpoints: none of the {len(on_disk)} checkpoint(s) in "
                             f"{directory} is intact ({what}); {hint}")


def _try_read(read: Callable[[int], T], step: int) -> tuple[T | None, str | None]:
    """``read(step)`` and None, or None and why it failed (any reader failure
    means the step is unusable; the reason says so in one line, and the reports
    of the reads Orbax abandoned are dropped: :mod:`depthbench.orbax_leftovers`)."""
    quiet_orbax_leftovers()
    try:
        return read(step), None
    except Exception as e:
        return None, f"the reader failed ({one_line(underlying(e))})"


def _warn_stderr(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def read_step(directory: Path, read: Callable[[int], T], step: int | None = None, *,
              warn: Callable[[str], None] | None = _warn_stderr) -> Found[T]:
    """A reader's restore: ``step`` (None: the newest intact one, naming the
    damaged steps skipped through ``warn``).  Nothing is moved or written.
    A missing directory, no steps, an unknown or a damaged ``step``:
    ConfigError."""
    on_disk = steps_on_disk(directory)
    if not on_disk:
        raise ConfigError(f"RUN_DIR: {directory} holds no finished checkpoint")
    if step is None:
        found = newest_intact(directory, read, hint="no step can be read; train the run "
                              "again or restore its checkpoints from a copy")
        if found.skipped and warn is not None:
            warn(f"depthbench: warning: skipped damaged checkpoint(s) in {directory} "
                 f"({found.skipped_text()}); reading step {found.step}")
        return found
    if step not in on_disk:
        raise ConfigError(f"--step: {step} is not one of the checkpointed steps {on_disk}")
    reason = step_problem(directory, step, finished_steps(directory))
    if reason is None:
        value, reason = _try_read(read, step)
        if reason is None:
            return Found(step, value, ())
    raise DamagedCheckpoints(f"--step: checkpoint {step} in {directory} is damaged ({reason}); "
                             "omit --step to read the newest intact one")


# ------------------------------------------------------------- parameters


def read_params(run_dir: Path, abstract_params: Any, step: int | None = None, *,
                warn: Callable[[str], None] | None = _warn_stderr) -> tuple[Any, int]:
    """The parameters of ``run_dir``'s newest intact (or the given) checkpoint,
    laid out as ``abstract_params`` (ShapeDtypeStructs with shardings) say.

    A step may hold the full train state (item ``state``: only its
    parameters are read, the optimizer state is skipped) or only the
    parameters (item ``params``, what a converted checkpoint holds).  The
    run's ``checkpoints/`` is read only if it is its own, not a link."""
    directory = confine.member(run_dir, CHECKPOINT_DIR, "RUN_DIR")
    if not directory.is_dir():
        raise ConfigError(f"RUN_DIR: {str(run_dir)!r} has no {CHECKPOINT_DIR}/ (was the "
                          "run started?)")
    found = read_step(directory, lambda s: _params_of(directory / str(s), abstract_params),
                      step, warn=warn)
    return found.value, found.step


@contextlib.contextmanager
def _quiet_orbax():
    """Orbax's notes go through absl's logger (``WARNING:absl:...`` lines); while
    a reader restores, it says what matters itself: the warning naming a skipped
    step, or one error line."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _params_of(step_dir: Path, abstract_params: Any) -> Any:
    with _quiet_orbax():
        return _read_params(step_dir, abstract_params)


def _shape_problem(stored: Any, abstract_params: Any) -> str | None:
    """Where the parameter tree a step's metadata declares (``stored``) differs
    from the one the run's config.json implies (None: nowhere): checked before
    Orbax allocates anything, so a config.json that declares a larger model
    than its checkpoint holds is one line, not a restore that fails half-way
    (leaving I/O callbacks to a closed event loop)."""
    import jax

    def shapes(tree: Any) -> dict[str, tuple]:
        leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))
        return {jax.tree_util.keystr(path): tuple(x.shape) for path, x in leaves
                if hasattr(x, "shape")}

    have, want = shapes(stored), shapes(abstract_params)
    for key in sorted(want):
        if key not in have:
            return f"it holds no parameter {key}, which config.json's model has"
        if have[key] != want[key]:
            return (f"it holds parameter {key} of shape {have[key]}, config.json's model "
                    f"{want[key]}")
    return None


def _read_params(step_dir: Path, abstract_params: Any) -> Any:
    import orbax.checkpoint as ocp

    item = step_dir / "params"
    if not item.is_dir():
        item = step_dir / "state"
        if not item.is_dir():
            raise ValueError(f"{step_dir} holds neither a 'params' nor a 'state' item")
    with ocp.PyTreeCheckpointer() as ckptr:
        stored = ckptr.metadata(item).item_metadata.tree
    problem = _shape_problem(stored if item.name == "params" else stored.get("params", {}),
                             abstract_params)
    if problem is not None:
        raise ValueError(problem)
    if item.name == "params":
        with ocp.StandardCheckpointer() as ckptr:
            return ckptr.restore(item, abstract_params)
    wanted = {"params": abstract_params}
    args = ocp.args.PyTreeRestore(
        item=wanted, restore_args=ocp.checkpoint_utils.construct_restore_args(wanted),
        partial_restore=True)
    with ocp.PyTreeCheckpointer() as ckptr:
        return ckptr.restore(item, args=args)["params"]
