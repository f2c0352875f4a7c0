"""The unit tier: in-process tests, seconds each.  A unit test that starts a
process (a subprocess, the ``depthbench`` command, a fork, a multiprocessing
child) fails at that line (tests/helpers/process_guard.py), and one marked ``slow``
(end-to-end: the real corpus, many training steps, another framework's
reference) stops the collection: both belong in tests/integration."""

from __future__ import annotations

from pathlib import Path

import pytest
from process_guard import forbidding

_UNIT = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    # Called once with every collected test, integration ones too.
    slow = [item.nodeid for item in items
            if _UNIT in item.path.resolve().parents and item.get_closest_marker("slow")]
    if slow:
        raise pytest.UsageError(
            f"{len(slow)} unit test(s) marked slow ({slow[0]} ...): end-to-end tests "
            "belong in tests/integration")


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
