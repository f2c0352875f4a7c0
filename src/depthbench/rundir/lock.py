"""The run lock: one process trains a run directory at a time.

:class:`RunLock` is the claim itself (a lock file naming its owner, kept
fresh by a heartbeat, taken over when stale); :func:`training_claim` is how
the trainer holds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from depthbench.errors import ConfigError
from depthbench.rundir.names import LOCK_FILE


def pid_alive(pid: Any) -> bool:
    """Whether process ``pid`` exists on this host (a pid of another user counts)."""
    try:
        pid = int(pid)
        if pid <= 0:
            return False
        os.kill(pid, 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


class RunLock:
    """An exclusive claim on a run directory by one process.

    The lock file is created with O_CREAT|O_EXCL (atomic on local disks and NFS),
    names the owner's host and pid, and is touched every ``stale_after / 4``
    seconds.  It is stale, and taken over, when its owner is on this host and
    gone, or untouched for ``stale_after`` seconds; with ``foreign_is_stale`` a
    lock from another host is stale at once (a run resumed on a new machine
    after a preemption).  A second O_EXCL file serialises taking over."""

    def __init__(self, run_dir: str | os.PathLike, *, stale_after: float = 600.0,
                 foreign_is_stale: bool = False):
        self.path = os.path.join(str(run_dir), LOCK_FILE)
        self.stale_after = float(stale_after)
        self.foreign_is_stale = foreign_is_stale
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held = False

    def holder(self) -> dict | None:
        """The owner record of the lock file, or None if unlocked."""
        try:
            with open(self.path) as f:
                record = json.load(f)
            record["age"] = time.time() - os.stat(self.path).st_mtime
            return record
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, OSError):
            # Being written this instant; the mtime rule still applies.
            try:
                return {"host": "?", "pid": -1, "age": time.time() - os.stat(self.path).st_mtime}
            except FileNotFoundError:
                return None

    def is_stale(self, record: dict) -> bool:
        if record.get("age", 0.0) > self.stale_after:
            return True
        if record.get("host") == socket.gethostname():
            return not pid_alive(record.get("pid", -1))
        return self.foreign_is_stale

    def held_elsewhere(self) -> bool:
        record = self.holder()
        return record is not None and not self.is_stale(record) and not self.held

    def held_by_this_process(self) -> bool:
        record = self.holder()
        return (record is not None and record.get("host") == socket.gethostname()
                and record.get("pid") == os.getpid())

    def acquire(self) -> bool:
        """Take the lock if free (or stale); False if a live process holds it."""
        for _ in range(3):
            if self._create():
                self.held = True
                self._start_heartbeat()
                return True
            record = self.holder()
            if record is None:
                continue  # released meanwhile: try again
            if not self.is_stale(record):
                return False
            self._break(record)
        return False

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.held:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.held = False

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                  "argv": sys.argv[:6]}
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        return True

    def _break(self, stale: dict) -> None:
        breaker = self.path + ".break"
        try:
            fd = os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - os.stat(breaker).st_mtime > 60:  # a breaker that died
                    os.unlink(breaker)
            return
        os.close(fd)
        try:
            now = self.holder()
            # Still the same stale owner (not a fresh lock taken meanwhile)?
            same = now is not None and all(now.get(k) == stale.get(k)
                                           for k in ("host", "pid", "started"))
            if same and self.is_stale(now):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(breaker)

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        interval = max(0.05, self.stale_after / 4)

        def beat() -> None:
            while not self._stop.wait(interval):
                try:
                    os.utime(self.path)
                except FileNotFoundError:
                    return

        self._thread = threading.Thread(target=beat, name="run-lock-heartbeat", daemon=True)
        self._thread.start()


def _busy(workdir: Path, lock: RunLock) -> ConfigError:
    pid = (lock.holder() or {}).get("pid", "?")
    return ConfigError(f"--workdir: {str(workdir)!r} is being trained by process {pid} on "
                       "this host; wait for it or stop it first")


def check_unclaimed(workdir: Path) -> None:
    """What :func:`training_claim` would refuse, checked without claiming (a dry
    run): another live process on this host trains ``workdir``."""
    lock = RunLock(workdir, foreign_is_stale=True)
    record = lock.holder()
    if record is not None and not lock.is_stale(record) and not lock.held_by_this_process():
        raise _busy(workdir, lock)


@contextlib.contextmanager
def training_claim(workdir: Path, enabled: bool = True) -> Iterator[None]:
    """Hold ``workdir``'s lock while a trainer writes into it: refuse (ConfigError)
    if another live process on this host trains it; take over a lock left by
    a dead process or by another host; nothing to do if this process (a
    sweep) already holds it."""
    if not enabled:
        yield
        return
    created = not workdir.exists()
    workdir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(workdir, foreign_is_stale=True)
    if not lock.held_by_this_process() and not lock.acquire():
        raise _busy(workdir, lock)
    try:
        yield
    finally:
        lock.release()
        with contextlib.suppress(OSError):
            if created and not any(workdir.iterdir()):
                workdir.rmdir()  # bad input found before anything was written: leave no trace
