"""Orbax checkpoints of a run: train state, data-iterator position, run clock.

One ``CheckpointManager`` under ``<workdir>/checkpoints`` keeps the last
``train.keep_checkpoints`` steps.  Each checkpoint is an
``ocp.args.Composite`` of

* ``state``: the :class:`~depthbench.train.state.TrainState` pytree (step,
  parameters, optimizer state, RNG key data), restored straight into the
  run's shardings (so a run may resume on a different mesh);
* ``data``: the grain iterator's position, so a resumed run sees exactly the
  batches it would have seen;
* ``meta``: small JSON (wall/compute seconds so far), so throughput and wall
  time in ``result.json`` cover the whole run, not just its last session.

Saves are asynchronous (the device-to-host copy happens before ``save``
returns, so the next step may donate the state's buffers); :meth:`close`
waits for the last one.  Orbax writes a step into a temporary directory and
renames it when complete, so a save interrupted by ``kill -9`` (or by a full
disk) leaves only a temporary directory, which Orbax ignores, and the
previous checkpoint untouched.

Integrity.  Once a save is finalized, process 0 writes
``<step>/integrity.json``: the size and SHA-256 of every file of the step.
:meth:`restore_latest` walks the steps newest first and skips a step whose
files no longer match its record (bit rot, a partial copy, a truncated
file) or whose reader fails (a step saved by a session killed before its
record was written is trusted to the reader alone).  Skipped steps are moved
to ``<workdir>/checkpoints.damaged/`` (kept for inspection; a later save
of the same step must not collide with them) and named in a warning.  If
checkpoints exist but none restores, :class:`DamagedCheckpoints` (a
``ConfigError``: exit status 2, one line) stops the run: restarting from
scratch silently would throw the run's progress away.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from depthbench import faults
from depthbench.digest import file_sha256 as file_digest
from depthbench.errors import ConfigError
from depthbench.train.state import TrainState

INTEGRITY_FILE = "integrity.json"
DAMAGED_SUFFIX = ".damaged"


class _QuietStorageErrors(logging.Filter):
    """Drop Orbax's background-thread tracebacks for a full disk: the run
    reports that failure itself, as one line naming the step and directory."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += str(record.exc_info[1])
        return not faults.is_storage_error(ValueError(text))


_QUIET = _QuietStorageErrors()


class DamagedCheckpoints(ConfigError):
    """Checkpoints exist but none of them can be restored."""


def integrity_record(step_dir: Path) -> dict:
    """``{"files": {relative path: [size, sha256]}}`` of every file under ``step_dir``."""
    files = {}
    for p in sorted(step_dir.rglob("*")):
        if p.is_file() and p.name != INTEGRITY_FILE:
            files[p.relative_to(step_dir).as_posix()] = [p.stat().st_size, file_digest(p)]
    return {"files": files}


def write_integrity(step_dir: Path) -> None:
    """Seal a finalized step (atomically: a torn record would condemn a good step)."""
    record = integrity_record(step_dir)
    tmp = step_dir / f".{INTEGRITY_FILE}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=0) + "\n")
    os.replace(tmp, step_dir / INTEGRITY_FILE)


def check_integrity(step_dir: Path) -> str | None:
    """Why ``step_dir`` does not match its integrity record (None: it matches,
    or it has no record to check against)."""
    path = step_dir / INTEGRITY_FILE
    if not path.exists():
        return None
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{INTEGRITY_FILE} is unreadable ({e})"
    for rel, (size, digest) in files.items():
        p = step_dir / rel
        if not p.is_file():
            return f"{rel} is missing"
        actual = p.stat().st_size
        if actual != size:
            return f"{rel} has {actual} bytes, not {size}"
        if file_digest(p) != digest:
            return f"{rel} does not match its recorded SHA-256"
    return None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text[:200]}"


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
            async_options=async_options)
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        logging.getLogger("absl").addFilter(_QUIET)
        self._saved: int | None = None  # the last step saved by this process (maybe in flight)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def steps_on_disk(self) -> list[int]:
        return self.steps_on_disk_of(self.directory)

    @staticmethod
    def steps_on_disk_of(directory: Path) -> list[int]:
        """Step directories present, whether or not Orbax can read them."""
        if not directory.is_dir():
            return []
        return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())

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
            raise faults.storage_error(
                e, f"checkpoints: could not write step {step} to {self.directory}",
                "earlier checkpoints are intact: free space and re-run the same command "
                "to resume") from e

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

        Damaged steps newer than the one restored are moved aside (process 0)
        and reported through ``warn``.  Raises :class:`DamagedCheckpoints` when
        step directories exist but none restores (nothing is moved then).
        """
        on_disk = self.steps_on_disk()
        if not on_disk:
            return None
        skipped: list[tuple[int, str]] = []
        for step in reversed(on_disk):
            reason = check_integrity(self.directory / str(step))
            if reason is None and step not in self.manager.all_steps():
                reason = "Orbax does not list it as a finished checkpoint"
            if reason is None:
                try:
                    restored = self.restore(step, abstract_state, data_arg)
                except Exception as e:  # any reader failure means this step is unusable
                    reason = f"the reader failed ({_one_line(e)})"
                else:
                    self._set_aside([s for s, _ in skipped])
                    if skipped and warn is not None:
                        what = "; ".join(f"step {s}: {r}" for s, r in skipped)
                        warn(f"warning: skipped damaged checkpoint(s) in {self.directory} "
                             f"({what}); moved to {self._damaged_dir()}; resuming from "
                             f"step {step}")
                    return restored
            skipped.append((step, reason))
        what = "; ".join(f"step {s}: {r}" for s, r in skipped)
        self.close()
        raise DamagedCheckpoints(
            f"checkpoints: none of the {len(on_disk)} checkpoint(s) in {self.directory} is "
            f"intact ({what}); move that directory away to start the run over")

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
            self._seal()  # a synchronous manager may not call the callback
        finally:
            self.manager.close()
            logging.getLogger("absl").removeFilter(_QUIET)
