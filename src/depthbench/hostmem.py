"""Keep freed host memory for reuse: three glibc ``malloc`` settings for the CPU step.

XLA:CPU allocates an executable's whole temp buffer at every run and frees it
after (1.1 GiB for the d 256 benchmark step, 2.5 GiB at d 768).  A request that
large is above glibc's ``mmap`` threshold, so glibc maps it from the kernel and
unmaps it on ``free``: every step page-faults the whole buffer in again
(281,000 minor faults per d 256 step, about half a core of kernel time on a
2-core VM).  Three ``mallopt`` settings stop it:

* ``M_ARENA_MAX = 1``: every thread allocates from the main arena.  XLA's
  worker threads would otherwise get arenas of their own, whose heaps cannot
  grow past 64 MiB, so glibc maps their large requests whatever the next
  setting says;
* ``M_MMAP_MAX = 0``: large requests grow the heap instead of being mapped;
* ``M_TRIM_THRESHOLD = -1``: the heap's top is never returned to the kernel
  (``mallopt(3)``: -1 disables trimming), so the next step reuses the pages.

Measured on a 2-core Intel Xeon VM (jax 0.10.2, one process, steps after the
first): the d 256 train step 1.93-2.08 s -> 1.47-1.51 s and 0 page faults per
step; d 768 8.9 -> 7.1 s (``bench/results/peer.md``).

The price: the process keeps its peak heap for its whole life, and all threads
share one arena.  So the ``depthbench`` command and ``python -m bench`` turn it
on for CPU runs only: not when ``JAX_PLATFORMS`` names something other than
the CPU, nor when an accelerator plugin (libtpu, a ``jax_plugins`` package) is
installed.  ``DEPTHBENCH_MALLOC`` overrides: ``keep`` (always), ``system``
(never), ``auto`` (the default above).  It must run before jax starts its
threads; in a notebook, call :func:`keep_freed_memory` in the first cell.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import pkgutil
import platform
import sys

from depthbench.errors import ConfigError

__all__ = ["ENV", "keep_freed_memory", "status"]

ENV = "DEPTHBENCH_MALLOC"
CHOICES = ("auto", "keep", "system")

# mallopt(3) parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8

_status: str | None = None  # what the first call decided; later calls return it


def status() -> str:
    """What :func:`keep_freed_memory` decided in this process ("not asked" before it ran)."""
    return _status or "not asked"


def accelerator_plugin() -> str | None:
    """The accelerator jax would use here, by name, or None when it is the CPU.
    Decided without importing jax (its threads must not exist yet)."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        first = platforms.split(",")[0].strip()
        return None if first == "cpu" else f"JAX_PLATFORMS={platforms}"
    if importlib.util.find_spec("libtpu") is not None:
        return "libtpu"
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        for module in pkgutil.iter_modules(spec.submodule_search_locations):
            return f"jax_plugins.{module.name}"
    for entry in importlib.metadata.entry_points(group="jax_plugins"):
        return f"jax_plugins entry point {entry.name}"
    return None


def keep_freed_memory(mode: str | None = None) -> str:
    """Apply the three settings (module docstring) if ``mode`` (default:
    ``$DEPTHBENCH_MALLOC``, else ``auto``) asks for them; returns one line
    saying what was done.  Idempotent: the first call decides."""
    global _status
    if _status is not None:
        return _status
    mode = (mode if mode is not None else os.environ.get(ENV, "")).strip().lower() or "auto"
    if mode not in CHOICES:
        raise ConfigError(f"${ENV}: {mode!r} is not one of {', '.join(CHOICES)}")
    if mode == "system":
        _status = f"glibc default (${ENV}=system)"
    elif not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        _status = "system default (not glibc)"
    elif mode == "auto" and (accelerator := accelerator_plugin()):
        _status = f"glibc default (accelerator: {accelerator})"
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
