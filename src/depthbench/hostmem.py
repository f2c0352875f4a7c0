"""Keep freed host memory for reuse: three glibc ``malloc`` settings, opt-in.

XLA:CPU allocates an executable's whole temp buffer at every run and frees it
after (1.1 GiB for the d 256 benchmark step, 2.5 GiB at d 768).  A request that
large is above glibc's ``mmap`` threshold, so glibc maps it from the kernel and
unmaps it on ``free``: every step page-faults the whole buffer in again
(281,000 minor faults per d 256 step).  Three ``mallopt`` settings stop it:

* ``M_ARENA_MAX = 1``: every thread allocates from the main arena.  XLA's
  worker threads would otherwise get arenas of their own, whose heaps cannot
  grow past 64 MiB, so glibc maps their large requests whatever the next
  setting says;
* ``M_MMAP_MAX = 0``: large requests grow the heap instead of being mapped;
* ``M_TRIM_THRESHOLD = -1``: the heap's top is never returned to the kernel
  (``mallopt(3)``: -1 disables trimming), so the next step reuses the pages.

It is a trade, so it is off unless asked for (``DEPTHBENCH_MALLOC=keep``).
Measured on a 2-core Intel Xeon VM (jax 0.10.2, one process, median step):
the d 256 peer step 1.63 -> 1.49 s (0 faults per step), d 768 7.63 -> 7.23 s;
but a deep-narrow step (d 64, L 32, T 256, B 2) 137 -> 207 ms, since with one
arena XLA's worker threads wait on its lock (2,225 voluntary context switches
per step against 352).  Use it for wide models on CPU.  The process also keeps
its peak heap for its whole life.  The ``depthbench`` command and ``python -m
bench`` apply it first thing, before numpy or jax start a thread (later it
only partly takes, and its status says so); in a notebook, call
:func:`keep_freed_memory` with ``"keep"`` in the first cell.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

from depthbench.errors import EXIT_BAD_INPUT, ConfigError

__all__ = ["ENV", "keep_freed_memory", "keep_freed_memory_or_exit", "status"]

ENV = "DEPTHBENCH_MALLOC"
CHOICES = ("system", "keep")  # the first is the default

# mallopt(3) parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8

_status: str | None = None  # what the first call decided; later calls return it


def status() -> str:
    """What :func:`keep_freed_memory` decided in this process ("not asked" before it ran)."""
    return _status or "not asked"


def keep_freed_memory(mode: str | None = None) -> str:
    """Apply the three settings (module docstring) if ``mode`` (default:
    ``$DEPTHBENCH_MALLOC``, else ``system``) is ``keep``; returns one line
    saying what was done.  Idempotent: the first call decides."""
    global _status
    if _status is not None:
        return _status
    mode = (mode if mode is not None else os.environ.get(ENV, "")).strip().lower() or CHOICES[0]
    if mode not in CHOICES:
        raise ConfigError(f"${ENV}: {mode!r} is not one of {', '.join(CHOICES)}")
    if mode == "system":
        _status = "system default"
    elif not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        _status = "system default (not glibc)"
    else:
        # Threads that numpy or jax started already hold arenas of their own,
        # which the settings do not reach (measured: 93,000 faults per d 256
        # step instead of 0), so say so.
        late = [m for m in ("numpy", "jax") if m in sys.modules]
        libc = ctypes.CDLL(None)
        done = [libc.mallopt(param, value) for param, value in
                ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))]
        _status = ("freed memory kept (one arena, no mmap, no trim)" if all(done)
                   else "glibc default (mallopt refused)")
        if all(done) and late:
            _status += (f"; set after {' and '.join(late)} {'was' if len(late) == 1 else 'were'}"
                        " imported: their threads' arenas may still map and unmap")
    return _status


def keep_freed_memory_or_exit(prog: str) -> str:
    """:func:`keep_freed_memory` for a command's first line (the ``depthbench``
    command, ``python -m bench``): a bad ``$DEPTHBENCH_MALLOC`` is one line on
    stderr and exit status 2, like every bad input."""
    try:
        return keep_freed_memory()
    except ConfigError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        raise SystemExit(EXIT_BAD_INPUT) from None
