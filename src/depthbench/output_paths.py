"""The one output rule: what a command will write, checked before any work, built aside.

Every output path goes through :func:`resolve` first (a link loop, or a place
among a run directory's own records, is one :class:`ConfigError`); a directory
a command builds is checked by :func:`check_out` and built in a hidden sibling
(:func:`built_aside`), renamed onto ``--out`` once complete
(docs/TROUBLESHOOTING.md)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from depthbench import faults
from depthbench.errors import ConfigError
from depthbench.rundir.lock import pid_alive
from depthbench.rundir.names import CONFIG_FILE, RUN_OWN

__all__ = ["LOOP", "built_aside", "check_out", "link_loop", "out_storage_error", "output_file",
           "remove_settled", "resolve"]


LOOP = "is a symbolic-link loop; give a path whose links end somewhere"


def link_loop(path: str | Path) -> bool:
    """Whether resolving ``path`` runs into a link loop (Python raises RuntimeError
    for it up to 3.12 and OSError after, or stops at the loop and leaves it to
    the first write)."""
    try:
        os.stat(Path(path).expanduser().resolve())
    except RuntimeError:
        return True
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def resolve(path: str | Path, field: str) -> Path:
    """``path`` with ``~`` expanded and links resolved; a loop, or a place among a
    run directory's own records (:func:`_run_records_at`), is one ConfigError."""
    if link_loop(path):
        raise ConfigError(f"{field}: {str(path)!r} {LOOP}")
    out = Path(path).expanduser().resolve()
    hit = _run_records_at(out)
    if hit is not None:
        run, record = hit
        raise ConfigError(f"{field}: {str(path)!r} is {record!r} of the run directory "
                          f"{str(run)!r} (or inside it), which that run's own commands write; "
                          "write the output somewhere else")
    return out


def _is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run's config.json (a JSON object naming model.family)."""
    cfg = path / CONFIG_FILE
    try:
        if not cfg.is_file() or cfg.stat().st_size > 1 << 24:
            return False
        saved = json.loads(cfg.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(saved, dict) and isinstance(saved.get("model"), dict) and (
        "family" in saved["model"])


def _run_records_at(out: Path) -> tuple[Path, str] | None:
    """``(run directory, its record)`` when ``out`` is that record of a run directory
    above it, or lies inside it; None otherwise."""
    for parent in out.parents:
        rel = out.relative_to(parent).parts
        if rel and rel[0] in RUN_OWN and _is_run_dir(parent):
            return parent, rel[0]
    return None


def output_file(path: str | Path, field: str) -> Path:
    """A file the command will write (an existing file is replaced): links
    resolved, not a directory, in a directory that exists."""
    if not str(path).strip():
        raise ConfigError(f"{field}: expected a file name, got ''")
    out = resolve(path, field)
    if out.is_dir():
        raise ConfigError(f"{field}: {str(path)!r} is a directory; give a file name (a new "
                          "file, or one to replace)")
    parent = out.parent
    if not parent.is_dir():
        existing = next((p for p in parent.parents if p.exists()), None)
        if parent.exists() or (existing is not None and not existing.is_dir()):
            blocker = parent if parent.exists() else existing
            raise ConfigError(f"{field}: {str(path)!r}: {str(blocker)!r} is a file, not a "
                              "directory")
        raise ConfigError(f"{field}: directory {str(parent)!r} does not exist; create it first")
    return out


def check_out(out: str | Path, command: str) -> Path:
    """``--out`` resolved (a link loop refused); ConfigError unless it is absent or
    an empty directory, and no live import is writing it."""
    path = resolve(out, f"{command}: --out")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{command}: --out {str(path)!r} is a file; give a new (or empty) "
                          "directory")
    if path.is_dir() and any(path.iterdir()):
        raise ConfigError(f"{command}: --out {str(path)!r} exists and is not empty; "
                          "use a new directory")
    if not path.parent.is_dir():
        parent = path.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise ConfigError(f"{command}: --out {str(path)!r}: {str(parent)!r} is a file, "
                              "not a directory")
    live = [pid for pid, _ in _work_dirs(path) if pid_alive(pid)]
    if live:
        raise ConfigError(f"{command}: --out {str(path)!r} is being written by another command "
                          f"(process {live[0]}); wait for it or use another directory")
    return path


# What a command building ``--out`` aside is doing (the hidden directory's suffix).
WORK_VERBS = ("importing", "exporting")


def _work_dirs(out: Path) -> list[tuple[int, Path]]:
    """The hidden ``.<name>.importing-PID`` (or ``exporting-PID``) directories beside
    ``out``: where imports and exports into ``out`` build it before renaming it
    (:func:`built_aside`)."""
    if not out.parent.is_dir():
        return []
    found = []
    for p in out.parent.iterdir():
        for verb in WORK_VERBS:
            prefix = f".{out.name}.{verb}-"
            pid = p.name.removeprefix(prefix)
            if p.name.startswith(prefix) and pid.isdigit() and p.is_dir() and not p.is_symlink():
                found.append((int(pid), p))
    return found


def _remove_leftovers(out: Path) -> None:
    """Remove what killed imports into ``out`` left (their process is gone):
    ``kill -9`` skips the cleanup :func:`write_run` does on every other failure."""
    for pid, work in _work_dirs(out):
        if pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def built_aside(out: Path, command: str, verb: str = "importing") -> Iterator[Path]:
    """A hidden work directory beside ``out`` (checked by :func:`check_out`) to
    build it in, renamed onto ``out`` when the block ends; on any failure it is
    removed and ``out`` left as it was, a full or read-only disk raised as the
    one line naming ``--out`` (``command``: whose line)."""
    _remove_leftovers(out)
    work = out.parent / f".{out.name}.{verb}-{os.getpid()}"
    try:
        work.mkdir(parents=True)
        yield work
        if out.is_dir():
            out.rmdir()  # empty (check_out), replaced by the finished directory
        os.replace(work, out)
    except BaseException as e:
        remove_settled(work)
        if isinstance(e, Exception) and faults.is_storage_error(e):
            raise out_storage_error(e, out, command) from e
        raise


def remove_settled(work: Path, quiet: float = 0.3, limit: float = 10.0) -> None:
    """Remove ``work`` and keep it removed: after a failed Orbax save, TensorStore's
    writes still in flight land for a moment (creating their directories again)."""
    deadline = time.monotonic() + limit
    gone_since = None
    while time.monotonic() < deadline:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since >= quiet:
            return
        time.sleep(0.01)


def out_storage_error(e: Exception, out: Path, command: str) -> faults.StorageError:
    """A full or read-only disk under the import, as one line naming ``--out``
    (not the hidden directory the run was being built in, which is gone)."""
    return faults.storage_error(e, f"{command}: could not write --out {out}",
                                f"nothing was written there: {faults.retry_hint(e)}")
