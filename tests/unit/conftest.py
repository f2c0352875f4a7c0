"""The unit tier: in-process tests, seconds each.  A unit test that starts a
process (a subprocess, the ``depthbench`` command, a fork, a multiprocessing
child) fails at that line (tests/process_guard.py); such a test belongs in
tests/integration."""

from __future__ import annotations

from pathlib import Path

import pytest
from process_guard import forbidding

_UNIT = Path(__file__).resolve().parent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # Setup (module- and session-scoped fixtures included), the test and its
    # teardown.  The hook is called for every test of the session once this
    # file is loaded, integration ones too, hence the check of where it lives.
    if _UNIT not in item.path.resolve().parents:
        yield
        return
    with forbidding("unit tests run in-process: move it to tests/integration"):
        yield
