"""Session-wide settings that make the CPU suite compile less and faster (helpers/fast_xla.py).

* ``XLA_FLAGS``: XLA's backend optimisation off.
* ``JAX_COMPILATION_CACHE_DIR``: jax's persistent compilation cache, kept
  between sessions (helpers/xla_cache.py: ``$DEPTHBENCH_CACHE/xla-tests/<cpu>``,
  cut back when it outgrows 2 GiB) and shared by the pytest workers and every
  subprocess a test starts, so a program compiled once (the same tiny train
  step in a fault test's reference run and in the ``depthbench`` subprocesses
  it kills and resumes, or in the last session) is not compiled again.  A cache
  hit is the same executable, so it computes the same values, bitwise.  Where
  that folder cannot be made, the session uses a new temporary one and removes
  it at the end; a ``JAX_COMPILATION_CACHE_DIR`` already set is used as it is.
  Every program is cached, however quick to compile, in either folder.

All must be in the environment before jax is imported, hence here, the first
thing pytest imports from ``tests/``.  Under pytest-xdist the controller sets
them before it starts the workers, which inherit them.

Once the tests are collected, each test process moves everything it has
imported (jax, torch, transformers ...) out of the garbage collector's sight
(``gc.freeze``) and collects its youngest generation less often: jax's
tracing makes many short-lived objects, and each collection walked the
imported modules' millions of objects again (5% of a unit file's CPU time,
bench/results/wall_times.md).  What is garbage is still collected.

A pytest-xdist worker leaves with ``os._exit`` once its last hook has run
(:func:`_leave_worker`): everything it reports is sent by then, and Python's
own teardown of it (freeing jax's compiled programs one by one) only kept
the controller waiting.

Where a machine sets ``PYTHONDONTWRITEBYTECODE``, no process writes the
bytecode of the checkout's sources, so every process of the suite (each
worker, each ``depthbench`` command a test starts) compiled all of
depthbench again; the controller compiles ``src/`` and ``tests/helpers/``
once (``compileall``, into the ``__pycache__`` folders beside them, which git
and the checkout guard ignore).  The variable itself stays: with it unset,
loading a spec file would leave a ``__pycache__`` beside the user's spec.

The session also fails when a test left a new file or directory in the
checkout (tests/helpers/checkout_guard.py): tests write under their temporary
directories, never into the repository.  The controller (the only process,
without pytest-xdist) compares the checkout at the start and at the end.

Both tiers share this file and the helper modules in ``tests/helpers/`` (its
README.md lists them; ``pythonpath = ["tests/helpers", "tests"]`` in
pyproject.toml puts them and the ``olmo_reference`` package on the import
path); ``tests/unit/conftest.py`` adds the rule that a unit test starts no
process.  Fixtures that a unit and an integration test file share live in the
helper modules named in ``pytest_plugins``.
"""

from __future__ import annotations

import compileall
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import xla_cache
from checkout_guard import CheckoutGuard
from fast_xla import with_fast_flags
from paths import HELPERS, REPO, SRC

# Fixture modules shared by the two tiers (a fixture is only set up where a test asks for it).
pytest_plugins = ["bad_input_commands", "data_synthetic", "lm_eval_tiny", "sweep_spec"]

os.environ["XLA_FLAGS"] = with_fast_flags(os.environ.get("XLA_FLAGS", ""))
# The commands the tests start keep XLA's own dot library whatever the CPU, so a
# command's numbers and this process's come from the same GEMM code
# (depthbench.cpu_dots; its own tests set the variable as they need).
os.environ["DEPTHBENCH_CPU_DOTS"] = "ynnpack"

_KEPT_CACHE: Path | None = None  # the suite's folder, kept between sessions (pruned)
_CACHE_OWNER = False  # or a temporary one this session removes at the end
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    try:
        _KEPT_CACHE = xla_cache.cache_dir()
        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_KEPT_CACHE)
    except OSError:  # a read-only home, a file where the folder goes: this session's own
        os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="depthbench-tests-xla-")
        _CACHE_OWNER = True
# Cache every compilation, however quick (jax's default skips those under 1 s), in
# whichever folder: a cold session then reuses a program another test or worker
# compiled (tests/unit cold about 8 s faster than caching only the slow ones; wall_times.md).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (pytest-xdist's workers have it)
        config.pluginmanager.register(CheckoutGuard(REPO), "depthbench-checkout-guard")
        if _KEPT_CACHE is not None:
            xla_cache.tidy(_KEPT_CACHE)
        for folder in (SRC, HELPERS):
            compileall.compile_dir(folder, quiet=2)


def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 100)  # Python's default: 700, 10, 10


@pytest.hookimpl(trylast=True)  # after every other plugin's
def pytest_unconfigure(config):
    if _CACHE_OWNER:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    if hasattr(config, "workerinput"):
        _leave_worker()


def _leave_worker():
    """End a pytest-xdist worker without tearing its interpreter down.

    By its last hook a worker has sent everything (its reports, and its exit
    status in ``workerfinished`` at session finish); what is left is
    Python's finalisation, which frees one by one the thousands of compiled
    XLA executables and traced functions jax keeps, 2-4 s the controller
    waits for at the end of every session (bench/results/wall_times.md).
    Nothing of the worker's is written at exit: the suite's files are the
    controller's (the JUnit report, the checkout guard, the cache folder)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
