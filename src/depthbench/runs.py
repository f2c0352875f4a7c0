"""A run directory: its file names, its lock, atomic writes, and whether a
config describes the run it holds.  Shared by the trainer and the sweep.

A run directory holds ``config.json`` (the config the run started with),
``result.json`` (written atomically when it ends), ``checkpoints/`` and a
lock file naming the process that trains it.  Writers replace files whole
(:func:`atomic_write`), so a reader never sees half a file, and two
processes never train one directory at once (:class:`RunLock`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_collections
from etils import epath

from depthbench.config import base_config, flatten, from_saved
from depthbench.errors import ConfigError
from depthbench.model.residual import registry

CONFIG_FILE = "config.json"
RESULT_FILE = "result.json"
CHECKPOINT_DIR = "checkpoints"
LOCK_FILE = "run.lock"

# Fields that say how a run executes, not what it computes: a run may resume
# with other values (another mesh after a preemption, another cache).  A
# trailing "." names a whole section.
RUNTIME_FIELDS = (
    "parallel.",
    "eval.",  # downstream evaluation after a sweep's run (depthbench.evaluation)
    "data.cache_dir",
    "data.prefetch",
    "data.worker_count",
    "train.keep_checkpoints",
    "train.checkpoint_every",
    "train.log_every",
    "train.eval_every",
    "train.layer_stats_every",
    "analysis.",
)


# ------------------------------------------------------------------- files


def as_path(path: str | os.PathLike) -> epath.Path:
    """A local or remote (gs://...) path; run directories may live in a bucket."""
    return epath.Path(path)


def is_local(path: str | os.PathLike) -> bool:
    return "://" not in str(path)


def atomic_write(path: str | os.PathLike, text: str) -> None:
    """Write a file so that readers see the old or the new content, never half."""
    path = as_path(path)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=1, default=str) + "\n")


def finite(x: float | None) -> bool:
    """Whether a recorded value (a loss, a norm) is a number, not None / NaN / inf."""
    return x is not None and math.isfinite(x)


def read_json(path: str | os.PathLike) -> dict | None:
    """The JSON object in ``path``; None if it is missing, unreadable or half-written."""
    try:
        return json.loads(as_path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError, OSError):
        return None


# ------------------------------------------------------------- comparison


def is_runtime_field(dotted: str) -> bool:
    return any(dotted == f or (f.endswith(".") and dotted.startswith(f)) for f in RUNTIME_FIELDS)


def identity(saved: dict) -> dict[str, Any]:
    """The fields that define the run a config describes, flattened: every field
    outside RUNTIME_FIELDS and ``resolved.*``, of ``model.residual`` only the
    chosen family's own.  A field missing from ``saved`` (added to the schema
    after it was written) takes its default, so old run directories keep their
    identity; another family's residual fields (which run directories written
    before per-family configs hold) are no part of it, so changing one
    family's default never touches another family's runs."""
    flat = flatten(from_saved(saved))
    defaults = flatten(base_config().to_dict())
    family = flat.get("model.family", defaults.get("model.family"))
    own = registry.get(family).config_fields() if family in registry.names() else {}
    prefix = "model.residual."
    out: dict[str, Any] = {}
    for key in set(flat) | set(defaults):
        if is_runtime_field(key) or key.startswith("resolved.") or key.startswith(prefix):
            continue
        value = flat.get(key, defaults.get(key))
        out[key] = tuple(value) if isinstance(value, list) else value
    for name, default in own.items():
        value = flat.get(prefix + name, default)
        out[prefix + name] = tuple(value) if isinstance(value, list) else value
    return out


def config_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(field, old, new) for every field of the runs' :func:`identity` whose
    value differs, sorted by field (``model.family`` before its fields)."""
    a, b = identity(old), identity(new)
    return [(key, a.get(key), b.get(key)) for key in sorted(set(a) | set(b))
            if a.get(key) != b.get(key)]


def saved_config(saved: dict) -> ml_collections.ConfigDict:
    """A config as a run saved it, fields added to the schema since then taking
    their defaults (what :func:`config_changes` assumes too), so code reading
    an old run's config finds every field."""

    def merge(defaults: dict, given: dict) -> dict:
        out = dict(defaults)
        for key, value in given.items():
            both = isinstance(value, dict) and isinstance(defaults.get(key), dict)
            out[key] = merge(defaults[key], value) if both else value
        return out

    return ml_collections.ConfigDict(merge(base_config().to_dict(), from_saved(saved)))


def check_run_dir(config, workdir: Path) -> dict | None:
    """Raise ConfigError if ``workdir`` holds a different run; return its
    ``result.json`` if the same run already ended there (None otherwise)."""
    cfg_path = workdir / CONFIG_FILE
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"--workdir: {str(workdir)!r} exists and is not a directory")
    if not cfg_path.exists():
        if (workdir / RESULT_FILE).exists() or (workdir / CHECKPOINT_DIR).exists():
            raise ConfigError(f"--workdir: {str(workdir)!r} holds a run without {CONFIG_FILE}; "
                              "use an empty or new directory")
        return None
    try:
        saved = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--workdir: {cfg_path} is unreadable ({e}); use a new directory") from e
    changes = config_changes(saved, config.to_dict())
    if changes:
        key, old, new = changes[0]
        raise ConfigError(f"config.{key}: {str(workdir)!r} holds a run with {key}={old!r}, not "
                          f"{new!r}; use the same config to resume it or a new --workdir")
    result_path = workdir / RESULT_FILE
    if result_path.exists():
        try:
            return json.loads(result_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"--workdir: {result_path} is unreadable ({e}); delete it to "
                              "finish the run again from its last checkpoint") from e
    return None


# -------------------------------------------------------------------- lock


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

    The lock file is created with O_CREAT|O_EXCL (atomic on local disks and
    NFS) and holds the owner's host and pid; a thread touches it every
    ``stale_after / 4`` seconds.  A lock is stale -- and is taken over -- when
    its owner is on this host and its pid is gone, or when it has not been
    touched for ``stale_after`` seconds (an owner on another host that died).
    With ``foreign_is_stale`` a lock from another host is stale at once (the
    trainer's rule: a run resumed on a new machine after a preemption takes
    over the dead machine's claim).  Taking over is serialised by a second
    O_EXCL file so two processes never both break the same stale lock.
    """

    def __init__(self, run_dir: str | os.PathLike, *, stale_after: float = 600.0,
                 foreign_is_stale: bool = False):
        self.path = os.path.join(str(run_dir), LOCK_FILE)
        self.stale_after = float(stale_after)
        self.foreign_is_stale = foreign_is_stale
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held = False

    # ---- inspection
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

    # ---- acquire / release
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

    # ---- internals
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
        pid = (lock.holder() or {}).get("pid", "?")
        raise ConfigError(f"--workdir: {str(workdir)!r} is being trained by process {pid} on "
                          "this host; wait for it or stop it first")
    try:
        yield
    finally:
        lock.release()
        with contextlib.suppress(OSError):
            if created and not any(workdir.iterdir()):
                workdir.rmdir()  # bad input found before anything was written: leave no trace
