"""Host memory for XLA:CPU steps: glibc by default, mimalloc or kept memory when asked.

glibc maps and unmaps each step's large temp buffer, so every step page-faults
it in again.  ``$DEPTHBENCH_MALLOC`` chooses ``system``, ``mimalloc`` (the
command re-executes itself once with it preloaded: :func:`apply_or_exit`) or
``keep`` (:func:`apply`); the modes and their costs: docs/CPU.md."""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform
import sys

from depthbench.errors import EXIT_BAD_INPUT, ConfigError

__all__ = ["CHOICES", "ENV", "apply", "apply_or_exit", "mimalloc_library", "setting", "status"]

ENV = "DEPTHBENCH_MALLOC"
CHOICES = ("system", "mimalloc", "keep")  # the first is the default
MIMALLOC_PACKAGE = "cmeel-mimalloc"
# What the re-executed process finds in its environment: the mimalloc
# settings this module added (so it can remove them again), and that it was
# re-executed (so it never is twice, whatever the loader made of them).
_REEXEC_MARK = "DEPTHBENCH_MALLOC_REEXEC"
# Never return freed memory to the kernel (so it is not faulted in again); no
# transparent huge pages (a fresh one can stall a step: bench/results/code_notes.md);
# commit each arena whole when it is made.
_MIMALLOC_ENV = {"MIMALLOC_PURGE_DELAY": "-1", "MIMALLOC_ALLOW_THP": "0",
                 "MIMALLOC_ARENA_EAGER_COMMIT": "1"}

# mallopt(3) parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8

_status: str | None = None  # what the first call decided; later calls return it


def status() -> str:
    """What :func:`apply` decided in this process ("not asked" before it ran)."""
    return _status or "not asked"


def setting(mode: str | None = None) -> str:
    """``mode`` (default: ``$DEPTHBENCH_MALLOC``, else ``system``), checked."""
    mode = (mode if mode is not None else os.environ.get(ENV, "")).strip().lower() or CHOICES[0]
    if mode not in CHOICES:
        raise ConfigError(f"${ENV}: {mode!r} is not one of {', '.join(CHOICES)}")
    return mode


def mimalloc_library() -> str | None:
    """The path of ``libmimalloc.so`` from the ``cmeel-mimalloc`` package, or None."""
    try:
        dist = importlib.metadata.distribution(MIMALLOC_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == "libmimalloc.so":
            path = str(dist.locate_file(f))
            return path if os.path.exists(path) else None
    return None


def _mimalloc_loaded() -> bool:
    """Whether a mimalloc library is mapped into this process."""
    try:
        with open("/proc/self/maps") as f:
            return "libmimalloc" in f.read()
    except OSError:
        return False


def _mimalloc_status() -> str:
    options = [f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith("MIMALLOC_")]
    return f"mimalloc ({', '.join(options) or 'its defaults'})"


def _mimalloc_plan() -> tuple[str, str | None]:
    """For ``mimalloc`` not loaded yet: this process's status, and the library to
    re-execute with (None when re-executing would not change anything)."""
    if not sys.platform.startswith("linux"):
        return "system default (mimalloc is preloaded on Linux only)", None
    library = mimalloc_library()
    if library is None:
        return f"system default (mimalloc: pip install {MIMALLOC_PACKAGE})", None
    if os.environ.get(_REEXEC_MARK):
        return "system default (mimalloc did not load)", None
    if os.environ.get("LD_PRELOAD"):
        return f"system default (LD_PRELOAD is set: {os.environ['LD_PRELOAD']})", None
    return ("system default (mimalloc is loaded at process start: the depthbench command "
            "and python -m bench do it)"), library


def _keep() -> str:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return "system default (not glibc)"
    # Threads that numpy or jax started already hold arenas of their own,
    # which the settings do not reach (the step still faults:
    # bench/results/peer.md, "2026-12-01 midday"), so say so.
    late = [m for m in ("numpy", "jax") if m in sys.modules]
    libc = ctypes.CDLL(None)
    done = [libc.mallopt(param, value) for param, value in
            ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))]
    if not all(done):
        return "glibc default (mallopt refused)"
    out = "freed memory kept (one arena, no mmap, no trim)"
    if late:
        out += (f"; set after {' and '.join(late)} {'was' if len(late) == 1 else 'were'}"
                " imported: their threads' arenas may still map and unmap")
    return out


def _decide(mode: str) -> tuple[str, str | None]:
    """Apply ``mode`` in this process as far as a running process can: the
    status line, and the mimalloc library to re-execute with (or None)."""
    if _mimalloc_loaded():  # preloaded, by this module or by you: it serves every mode
        return _mimalloc_status(), None
    if mode == "keep":
        return _keep(), None
    if mode == "system":
        return "system default", None
    return _mimalloc_plan()


def apply(mode: str | None = None) -> str:
    """Apply ``mode`` in this process (``keep``: the ``mallopt`` settings;
    ``mimalloc``: report whether it is loaded, which only a process's start
    decides) and return one line saying what holds.  Never re-executes; the
    first call decides."""
    global _status
    mode = setting(mode)  # checked at every call: a bad setting is never passed over
    if _status is None:
        _status = _decide(mode)[0]
    return _status


def apply_or_exit(prog: str) -> str:
    """:func:`apply` for a command's first line: where ``mimalloc`` is asked for
    and not loaded, re-execute the same command line in place with it (once),
    and in the re-executed process take the added variables out of the
    environment again.  A bad ``$DEPTHBENCH_MALLOC`` is one line on stderr and
    exit status 2."""
    global _status
    try:
        mode = setting()
    except ConfigError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        raise SystemExit(EXIT_BAD_INPUT) from None
    if _status is None:
        decided, library = _decide(mode)
        if library is not None:
            added = {k: v for k, v in _MIMALLOC_ENV.items() if k not in os.environ}
            env = dict(os.environ, LD_PRELOAD=library, **added,
                       **{_REEXEC_MARK: ",".join(["LD_PRELOAD", *added])})
            sys.stdout.flush()
            sys.stderr.flush()
            # sys.orig_argv: the interpreter's own flags and `-m module` or the
            # script, as this process was started.
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
        _status = decided
    for name in filter(None, os.environ.pop(_REEXEC_MARK, "").split(",")):
        os.environ.pop(name, None)  # loaded already; the processes this one starts begin clean
    return _status
