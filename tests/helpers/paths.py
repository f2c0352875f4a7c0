"""Where the tests find the repository's files, whichever tier directory a test lives in.

Every test that needs a path of the checkout (the repository root, its
``experiments/`` or ``docs/``, the test fixtures) takes it from here, so that
moving a test file between ``tests/unit`` and ``tests/integration`` never
changes what a path points to.
"""

from __future__ import annotations

import os
from pathlib import Path

HELPERS = Path(__file__).resolve().parent  # tests/helpers/: the shared helper modules
TESTS = HELPERS.parent  # tests/: the tiers, conftest.py, olmo_reference/, fixtures/
REPO = TESTS.parent  # the checkout's root
SRC = REPO / "src"
FIXTURES = TESTS / "fixtures"


def pythonpath_with_tests() -> str:
    """``PYTHONPATH`` for a subprocess that runs a test file as a script:
    ``tests/helpers/`` and ``tests/`` first (the helper modules and the
    ``olmo_reference`` package the file may import, as pytest's ``pythonpath``
    gives the test process), then this process's own ``PYTHONPATH``."""
    return os.pathsep.join(filter(None, [str(HELPERS), str(TESTS),
                                         os.environ.get("PYTHONPATH", "")]))
