"""Where the tests find the repository's files, whichever tier directory a test lives in.

Every test that needs a path of the checkout (the repository root, its
``experiments/`` or ``docs/``, the test fixtures) takes it from here, so that
moving a test file between ``tests/unit`` and ``tests/integration`` never
changes what a path points to.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/: the shared helper modules
REPO = TESTS.parent  # the checkout's root
SRC = REPO / "src"
FIXTURES = TESTS / "fixtures"
