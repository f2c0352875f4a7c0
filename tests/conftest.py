"""Session-wide settings that make the CPU suite compile less and faster (see tests/fast_xla.py).

* ``XLA_FLAGS``: XLA's backend optimisation off.
* ``JAX_COMPILATION_CACHE_DIR``: one persistent compilation cache per test
  session (a new, empty directory, removed at the end), shared by the pytest
  workers and every subprocess a test starts, so a program compiled once (the
  same tiny train step in a fault test's reference run and in the ``depthbench``
  subprocesses it kills and resumes) is not compiled again.  A cache hit is the
  same executable, so it computes the same values, bitwise.

Both must be in the environment before jax is imported, hence here, the first
thing pytest imports from ``tests/``.  Under pytest-xdist the controller sets
them before it starts the workers, which inherit them.

The session also fails when a test left a new file or directory in the
checkout (tests/checkout_guard.py): tests write under their temporary
directories, never into the repository.  The controller (the only process,
without pytest-xdist) compares the checkout at the start and at the end.

Both tiers share this file and the helper modules beside it (``pythonpath =
["tests"]`` in pyproject.toml); ``tests/unit/conftest.py`` adds the rule that
a unit test starts no process.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from checkout_guard import created, snapshot
from fast_xla import with_fast_flags
from paths import REPO

os.environ["XLA_FLAGS"] = with_fast_flags(os.environ.get("XLA_FLAGS", ""))

_CACHE_OWNER = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _CACHE_OWNER:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="depthbench-tests-xla-")
    # Cache every compilation, however quick (jax's default skips those under 1 s).
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


_CHECKOUT = pytest.StashKey[frozenset]()
_LEFT_IN_CHECKOUT = pytest.StashKey[list]()


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")  # pytest-xdist's workers have it


def _session_tmp(config):
    return config.option.basetemp  # a --basetemp put inside the checkout is the tests' own


def pytest_sessionstart(session):
    if _controller(session.config):
        session.config.stash[_CHECKOUT] = snapshot(REPO, _session_tmp(session.config))


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if _CHECKOUT not in config.stash:
        return
    left = created(config.stash[_CHECKOUT], snapshot(REPO, _session_tmp(config)))
    if left:
        config.stash[_LEFT_IN_CHECKOUT] = left
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    left = config.stash.get(_LEFT_IN_CHECKOUT, [])
    if left:
        terminalreporter.write_line(
            f"FAILED: tests left {len(left)} new path(s) in the checkout {REPO}: "
            f"{', '.join(left)}; a test must write under its tmp_path, never into the "
            "repository (remove them, then find the test)", red=True, bold=True)


def pytest_unconfigure(config):
    if _CACHE_OWNER:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
