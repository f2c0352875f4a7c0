"""Where the tests find the repository's files, whichever tier directory a test lives in.

Every test that needs a path of the checkout (the repository root, its
``experiments/`` or ``docs/``, the test fixtures) takes it from here, so that
moving a test file between ``tests/unit`` and ``tests/integration`` never
changes what a path points to.
"""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/: the shared helper modules
REPO = TESTS.parent  # the checkout's root
SRC = REPO / "src"
FIXTURES = TESTS / "fixtures"


def pythonpath_with_tests() -> str:
    """``PYTHONPATH`` for a subprocess that runs a test file as a script: ``tests/``
    first (the helper modules the file imports, as pytest's ``pythonpath`` gives
    the test process), then this process's own ``PYTHONPATH``."""
    return os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH", "")]))
