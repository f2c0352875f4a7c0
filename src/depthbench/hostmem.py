"""Host memory for XLA:CPU steps: glibc by default, mimalloc or kept memory when asked.

XLA:CPU allocates an executable's whole temp buffer at every run and frees it
after (1.1 GiB for the d 256 benchmark step, 2.5 GiB at d 768), from one of
its async-runner threads (``posix_memalign`` in ``CpuDeviceMemory``).  glibc
serves a request that large with ``mmap`` from that thread's arena and unmaps
it on ``free``, so every step page-faults the whole buffer in again, 4 KiB at
a time, and the kernel's share of the step's CPU time is large
(bench/results/allocator.md).  ``$DEPTHBENCH_MALLOC`` chooses what to do:

* ``system`` (the default): glibc as configured.  Nothing is changed and the
  process is never re-executed, so the ``depthbench`` command and
  ``depthbench.cli.main()`` called from Python run alike.
* ``mimalloc``: the command runs with the mimalloc allocator (``LD_PRELOAD``
  of the ``cmeel-mimalloc`` package's library), told never to return freed
  memory to the kernel (``MIMALLOC_PURGE_DELAY=-1``), to use no transparent
  huge pages and to commit its arenas whole (:data:`_MIMALLOC_ENV`; a
  ``MIMALLOC_*`` variable you set wins): the temp buffer is reused, 0 faults
  per step, and mimalloc's per-thread heaps take no lock that XLA's threads
  wait on.  The process keeps its peak heap for its life.  An allocator is
  chosen when a process starts, so the command entry points
  (:func:`apply_or_exit`: the ``depthbench`` command, ``python -m bench``),
  asked for it, re-execute the same command line once, in place (same pid),
  with those variables set, then remove them from the environment, so the
  processes it starts begin as usual.  Not done when ``$LD_PRELOAD`` is set
  already (your allocator wins).  The same by hand, as MaxText documents
  tcmalloc: ``LD_PRELOAD=$(python -c 'from depthbench import hostmem;
  print(hostmem.mimalloc_library())') MIMALLOC_PURGE_DELAY=-1
  MIMALLOC_ALLOW_THP=0 MIMALLOC_ARENA_EAGER_COMMIT=1 depthbench ...``.
* ``keep``: glibc, with three ``mallopt`` settings made in-process before
  numpy or jax start a thread: one arena (``M_ARENA_MAX = 1``; a thread
  arena's heap cannot grow past 64 MiB, so glibc maps large requests
  whatever the next setting says), no ``mmap`` (``M_MMAP_MAX = 0``) and no
  trimming (``M_TRIM_THRESHOLD = -1``).  0 faults per step too, but XLA's
  threads then wait on the one arena's lock.

What the default costs the quickstart's CPU step is measured in
``bench/results/hostmem.md``; what ``mimalloc`` and ``keep`` bought per shape
(``keep`` slows deep narrow steps: XLA's threads wait on the one arena), and
the stalls that transparent huge pages gave mimalloc on a VM that hands free
memory back to its host (hence ``MIMALLOC_ALLOW_THP=0``), in
``bench/results/allocator.md`` (the dated runs: ``bench/results/peer.md``).

In a notebook, start the kernel with ``LD_PRELOAD=<mimalloc_library()>`` and
those ``MIMALLOC_*`` settings in its environment, or call :func:`apply` with
``"keep"`` in the first cell; a notebook's process is never re-executed.
"""

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
    ``mimalloc``: report whether mimalloc is loaded, which only a process's
    start decides) and return one line saying what holds.  Never re-executes.
    Idempotent: the first call decides."""
    global _status
    mode = setting(mode)  # checked at every call: a bad setting is never passed over
    if _status is None:
        _status = _decide(mode)[0]
    return _status


def apply_or_exit(prog: str) -> str:
    """:func:`apply` for a command's first line (the ``depthbench`` command,
    ``python -m bench``): where ``$DEPTHBENCH_MALLOC=mimalloc`` asks for mimalloc
    and it is not loaded, re-execute the same command line in place with it
    (once); in the re-executed process, take the variables this added out of
    the environment again.  By default nothing is re-executed.  A bad
    ``$DEPTHBENCH_MALLOC`` is one line on stderr and exit status 2, like every
    bad input."""
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
