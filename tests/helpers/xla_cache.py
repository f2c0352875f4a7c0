"""Where the test suite keeps XLA's compiled programs: across sessions, per host CPU.

The CPU suite's time is mostly jax tracing, lowering and XLA compiling a few
thousand tiny programs (bench/results/wall_times.md).  jax's persistent
compilation cache keys an entry on the lowered program, the XLA flags, the
compile options and the jax/jaxlib versions, so an entry is reused only for
the same program compiled the same way, and a hit is the same executable,
computing the same values bitwise.  Kept between sessions, the second run of
an unchanged tier compiles almost nothing (bench/results/wall_times.md has
the warm and cold figures); a change recompiles only the programs it touches.

The folder is ``xla-tests/<cpu>`` under the data cache's root
(``$DEPTHBENCH_CACHE``, default ``~/.cache/depthbench``): ``<cpu>`` digests the host's CPU
model and instruction-set flags, because a CPU executable is compiled for the
host's instruction set, and a home folder shared by machines of different
CPUs must not hand one's programs to the other.  At the start of a session the
folder is cut back to :data:`KEEP_BYTES`, oldest entries first, once it holds
more than :data:`LIMIT_BYTES` (jax's own ``jax_compilation_cache_max_size``
rescans the folder on every write), and the entries written since the last
session are read back (:func:`drop_unreadable`; both from one listing,
:func:`tidy`): jax writes an entry in place, so a process killed mid-write
(the fault tests kill ``depthbench`` commands) leaves a truncated entry, which
jax would warn about on every later read without ever rewriting it.

A cold run, to time the suite as a fresh machine runs it: point
``JAX_COMPILATION_CACHE_DIR`` at an empty folder (the suite then uses it and
leaves it in place), or delete the folder above.
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

LIMIT_BYTES = 2 << 30  # past this at a session's start, the folder is cut back ...
KEEP_BYTES = 1 << 30  # ... to this, the oldest entries removed first


def cpu_tag() -> str:
    """12 hex digits naming this host's CPU: its model and feature flags where
    Linux lists them (``/proc/cpuinfo``), else what ``platform`` says."""
    text = f"{platform.system()} {platform.machine()} {platform.processor()}"
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    # The first CPU's model name and flags (arm64: Features): the same on every core.
    for prefix in ("model name", "flags", "Features", "CPU part"):
        text += next((" " + line for line in lines if line.startswith(prefix)), "")
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_dir() -> Path:
    """``xla-tests/<cpu_tag()>`` under the data cache's root
    (:func:`depthbench.data.cache.cache_root`: ``$DEPTHBENCH_CACHE``, else
    ``~/.cache/depthbench``), created if missing; ``OSError`` when it cannot be
    (a root that is a file or a link loop included).  Imports no jax."""
    from depthbench.data.cache import cache_root
    from depthbench.errors import ConfigError

    try:
        folder = cache_root() / "xla-tests" / cpu_tag()
    except ConfigError as e:
        raise OSError(str(e)) from None
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def tidy(folder: Path) -> None:
    """What a session does first with the kept folder, from one listing of it:
    :func:`prune`, then :func:`drop_unreadable`."""
    found = entries(folder)
    prune(folder, found=found)
    drop_unreadable(folder, found=found)


def entries(folder: Path) -> list[tuple[float, int, Path]]:
    """``(modification time, size, path)`` of each file in ``folder``; files another
    process removes meanwhile are left out."""
    found = []
    with os.scandir(folder) as listing:
        for entry in listing:
            try:
                if entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    found.append((st.st_mtime, st.st_size, Path(entry.path)))
            except OSError:
                continue
    return found


def prune(folder: Path, limit: int = LIMIT_BYTES, keep: int = KEEP_BYTES,
          found: list[tuple[float, int, Path]] | None = None) -> int:
    """If the files in ``folder`` (``found``: its :func:`entries`, if listed already)
    hold more than ``limit`` bytes, remove the oldest (by modification time) until
    at most ``keep`` remain; the number removed.  Files another process removes
    meanwhile are skipped."""
    found = entries(folder) if found is None else found
    total = sum(size for _, size, _ in found)
    if total <= limit:
        return 0
    removed = 0
    for _, size, path in sorted(found, key=lambda e: e[0]):
        if total <= keep:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        removed += 1
    return removed


CHECKED = ".checked"  # its modification time: when the entries were last read back


def _decompress() -> Callable[[bytes], bytes]:
    """jax's own reader of an entry's bytes (zstd or zlib, as jax wrote them)."""
    try:
        from jax._src.compilation_cache import decompress_executable
    except ImportError:  # a jax that moved it: the zlib jax uses without zstd
        import zlib

        return zlib.decompress
    return decompress_executable


def drop_unreadable(folder: Path, decompress: Callable[[bytes], bytes] | None = None,
                    found: list[tuple[float, int, Path]] | None = None) -> list[str]:
    """Remove the entries of ``folder`` (``found``: its :func:`entries`, if listed
    already) written since the last call that do not decompress (cut short); their
    names.  The first call reads every entry.  jax is imported only when an entry
    is to be read (a session with nothing new starts without it)."""
    found = entries(folder) if found is None else found
    marker = folder / CHECKED
    try:
        since = marker.stat().st_mtime - 1.0  # a second's slack for coarse clocks
    except OSError:
        since = float("-inf")
    started = time.time()
    dropped = []
    for mtime, _, path in found:
        if mtime < since or not path.name.endswith("-cache"):
            continue
        decompress = decompress or _decompress()
        try:
            decompress(path.read_bytes())
        except OSError:  # removed by another session meanwhile
            continue
        except Exception:  # zlib.error, zstd's errors: a truncated stream
            path.unlink(missing_ok=True)
            dropped.append(path.name)
    marker.touch()
    os.utime(marker, (started, started))
    return dropped
