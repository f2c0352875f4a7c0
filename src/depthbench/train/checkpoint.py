"""Orbax checkpoints of a run: train state, data-iterator position, run clock.

The state is restored straight into the run's shardings (a run may resume on
another mesh) and the iterator where it stood (the same batches); saves are
asynchronous and sealed once finalized; a resume takes the newest intact step
and sets damaged newer ones aside (docs/RUNS.md, docs/TROUBLESHOOTING.md)."""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from depthbench import faults
from depthbench.errors import ConfigError
from depthbench.orbax_leftovers import quiet_orbax_leftovers
from depthbench.output_paths import remove_settled
from depthbench.rundir.integrity import write_integrity
from depthbench.rundir.names import DAMAGED_SUFFIX, INTEGRITY_FILE
from depthbench.rundir.restore import finished_steps, newest_intact
from depthbench.train.state import TrainState


class _QuietStorageErrors(logging.Filter):
    """Drop Orbax's background-thread tracebacks for a full disk (absl's logger),
    asyncio's reports of the same failure in futures no one awaited, and Orbax's
    note on removing such a save's temporary directory: the run reports the
    failure itself, as one line naming the step and directory."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "Removing existing directory since it is not finalized" in text:
            return False
        if record.exc_info and record.exc_info[1] is not None:
            text += str(record.exc_info[1])
        return not faults.is_storage_error(ValueError(text))


_QUIET = _QuietStorageErrors()
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # where Orbax writes a step before renaming it


def quiet_failed_writes() -> None:
    """Leave a failed Orbax write (a full disk) to the one line its writer says.
    Every Orbax writer calls it (the trainer's checkpoints, the imports' step 0)."""
    absl_logger = logging.getLogger("absl")
    if _QUIET not in absl_logger.filters:
        absl_logger.addFilter(_QUIET)
    # asyncio reports a failed write's gathered futures when they are garbage
    # collected ("exception was never retrieved"), at a time no one controls
    # (often after close, at exit), so its filter stays for the process.
    asyncio_logger = logging.getLogger("asyncio")
    if _QUIET not in asyncio_logger.filters:
        asyncio_logger.addFilter(_QUIET)
    quiet_orbax_leftovers()


def resume_hint(directory: Path) -> str:
    """What re-running after a failed write resumes from, as the checkpoints on
    disk say (a step whose save failed is not listed as finished)."""
    steps = sorted(finished_steps(directory))
    if steps:
        return (f"the checkpoint of step {steps[-1]} is intact: free space and re-run the same "
                "command to resume from it")
    return ("no checkpoint was written yet: free space and re-run the same command to start "
            "the run over")


class Checkpoints:
    def __init__(self, directory: str | Path, keep: int = 2, *, async_save: bool = True,
                 main_process: bool = True):
        self.directory = Path(directory).resolve()
        self.main = main_process
        self._async = async_save
        self._lock = threading.Lock()
        self._unsealed: set[int] = set()  # saved by this process, record not yet written
        # Orbax accepts a finalization callback only on an asynchronous manager; a
        # synchronous one is sealed by wait() (below) instead.
        async_options = (ocp.AsyncOptions(post_finalization_callback=self._seal)
                         if async_save else None)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max(1, int(keep)), create=True, enable_async_checkpointing=async_save,
            async_options=async_options, cleanup_tmp_directories=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        quiet_failed_writes()
        self._saved: int | None = None  # the last step saved by this process (maybe in flight)

    def save(self, step: int, state: TrainState, data_arg: Any, meta: dict) -> None:
        """Save ``state`` (``data_arg``: the data module's save arg for the iterator;
        None for a run with no data position, e.g. one made by ``import-hf``)."""
        if step == self._saved or step in self.manager.all_steps():
            return  # e.g. a preemption right after a periodic save (perhaps still in flight)
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
        if data_arg is not None:
            items["data"] = data_arg
        args = ocp.args.Composite(**items)
        # Orbax waits for the previous (asynchronous) save before starting this
        # one anyway; waiting here attributes a failure to the step that failed.
        self.wait()
        with self._lock:
            self._unsealed.add(step)
        with self._failed_write(step):
            self.manager.save(step, args=args, force=True)
        self._saved = step
        if not self._async:
            self._seal()  # the step is complete on disk: write its integrity record now

    @contextlib.contextmanager
    def _failed_write(self, step: int | None):
        """A full disk during a save becomes one clear :class:`~depthbench.faults.StorageError`."""
        try:
            yield
        except Exception as e:
            if not faults.is_storage_error(e):
                raise
            # The trainer replaces the hint with what a re-run resumes from (resume_hint).
            raise faults.storage_error(
                e, f"checkpoints: could not write step {step} to {self.directory}",
                faults.retry_hint(e)) from e

    def _seal(self) -> None:
        """Write the integrity record of every finalized step this process saved
        (Orbax calls this after each finalization, on its background thread)."""
        with self._lock:
            # A step whose directory is not there yet is still being written.
            done = {s for s in self._unsealed if (self.directory / str(s)).is_dir()}
            self._unsealed -= done
        if not self.main:
            return
        for step in sorted(done):
            step_dir = self.directory / str(step)
            if not (step_dir / INTEGRITY_FILE).exists():
                write_integrity(step_dir)

    def restore(self, step: int, abstract_state: TrainState, data_arg: Any
                ) -> tuple[TrainState, dict]:
        """The state at ``step`` (laid out as ``abstract_state``'s shardings say),
        the iterator restored in place through ``data_arg``, and the meta dict."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=data_arg,
                                  meta=ocp.args.JsonRestore())
        out = self.manager.restore(step, args=args)
        return out["state"], dict(out["meta"] or {})

    def restore_latest(self, abstract_state: TrainState, data_arg: Any,
                       warn: Callable[[str], None] | None = None
                       ) -> tuple[TrainState, dict] | None:
        """Restore the newest intact checkpoint; None when there is none at all.
        Damaged newer steps are moved to ``checkpoints.damaged/`` (process 0) and
        reported through ``warn``.  Raises
        :class:`~depthbench.rundir.restore.DamagedCheckpoints` when step directories
        exist but none restores (nothing is moved then)."""
        try:
            found = newest_intact(self.directory,
                                  lambda step: self.restore(step, abstract_state, data_arg),
                                  hint="move that directory away to start the run over")
        except ConfigError:
            self.close()
            raise
        if found is None:
            return None
        self._set_aside([s for s, _ in found.skipped])
        if found.skipped and warn is not None:
            warn(f"depthbench: warning: skipped damaged checkpoint(s) in {self.directory} "
                 f"({found.skipped_text()}); moved to {self._damaged_dir()}; resuming from "
                 f"step {found.step}")
        return found.value

    def _damaged_dir(self) -> Path:
        return self.directory.with_name(self.directory.name + DAMAGED_SUFFIX)

    def _set_aside(self, steps: list[int]) -> None:
        if not steps or not self.main:
            return
        target = self._damaged_dir()
        target.mkdir(exist_ok=True)
        for step in steps:
            dest, n = target / str(step), 1
            while dest.exists():
                dest, n = target / f"{step}.{n}", n + 1
            shutil.move(str(self.directory / str(step)), str(dest))
        self.manager.reload()

    def wait(self) -> None:
        with self._failed_write(self._saved):
            self.manager.wait_until_finished()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            # Orbax calls the callback before it renames the step into place, so the
            # newest finalized step is sealed here (every step, for a synchronous
            # manager), also when a later save failed.
            try:
                self._seal()
            except OSError as e:
                if not faults.is_storage_error(e):
                    raise
                # A full disk: the step stays unsealed; readers check it by restoring it.
            finally:
                self.manager.close()
                logging.getLogger("absl").removeFilter(_QUIET)
                if self.main:  # every save has ended: a temporary directory left is a failed one
                    for tmp in self.directory.glob(f"*{TMP_SUFFIX}*"):
                        remove_settled(tmp)
