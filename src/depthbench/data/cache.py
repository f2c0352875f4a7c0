"""The on-disk cache: where prepared data lives, and how it is written safely.

Every entry lives under one cache root in a directory named by a digest of
what determines its content, built under a temporary name and renamed into
place only when complete: a failed run leaves nothing a later one would
trust (a killed one's temporary directory is removed by the next build), and
of two processes racing to build an entry the first rename wins."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from depthbench import output_paths
from depthbench.errors import ConfigError
from depthbench.rundir.lock import pid_alive

ENV_VAR = "DEPTHBENCH_CACHE"


def cache_root(cache_dir: str = "") -> Path:
    """``data.cache_dir``, else ``$DEPTHBENCH_CACHE``, else ``~/.cache/depthbench``
    (links resolved; a loop, a file or a path through one is one ConfigError
    naming :func:`cache_field`; nothing is created)."""
    root = cache_dir or os.environ.get(ENV_VAR) or os.path.join("~", ".cache", "depthbench")
    return usable_dir(output_paths.resolve(root, cache_field(cache_dir)), cache_field(cache_dir))


def cache_field(cache_dir: str = "") -> str:
    """What chose the cache root, as a message names it: the config field, else
    the environment variable, else the default."""
    if cache_dir:
        return "config.data.cache_dir"
    if os.environ.get(ENV_VAR):
        return f"${ENV_VAR}"
    return f"the data cache (default ~/.cache/depthbench; ${ENV_VAR} moves it)"


def usable_dir(path: Path, field: str) -> Path:
    """``path`` if it is, or can be made, a directory: one ConfigError naming ``field``
    when it or the nearest existing parent is a file (checked before anything is written)."""
    for existing in (path, *path.parents):
        if existing.exists():
            if existing.is_dir():
                return path
            if existing == path:
                raise ConfigError(f"{field}: {path} exists and is not a directory")
            raise ConfigError(f"{field}: {existing} is a file, so {path} cannot be a directory")
    return path


@contextlib.contextmanager
def exclusive(root: str | Path) -> Iterator[None]:
    """Hold the cache root's lock: concurrent ``prepare`` calls (pytest workers,
    the processes of one host) build each entry once instead of racing."""
    import fcntl  # POSIX only; the cache is too

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def digest(*parts: Any, length: int = 16) -> str:
    """A short, stable hex digest of JSON-able parts (a cache key)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _tmp_sibling(final: Path) -> Path:
    """A new temporary name beside ``final``; those of this host's killed processes
    are removed (another host's, on a shared disk, may be building)."""
    prefix = f".{final.name}.tmp-{socket.gethostname()}-"
    for left in final.parent.glob(f"{prefix}*"):
        if not pid_alive(left.name.removeprefix(prefix).split("-")[0]):
            if left.is_dir():
                shutil.rmtree(left, ignore_errors=True)
            else:
                left.unlink(missing_ok=True)
    return final.with_name(f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Build a directory under a temporary name; rename it to ``final`` on success.
    On any exception the temporary directory is removed and ``final`` left
    absent; if another process created ``final`` meanwhile its copy is kept
    (entries are content-addressed, so both are the same)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(final)
    tmp.mkdir()
    try:
        yield tmp
        try:
            os.replace(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(final: str | Path, mode: str = "wb") -> Iterator[Any]:
    """Open a temporary file beside ``final``; rename it into place when closed cleanly."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(final)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_file(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def read_json(path: str | Path) -> Any:
    with open(path) as f:
        return json.load(f)
