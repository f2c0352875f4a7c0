"""The ``depthbench`` console script, as installed: one run of the command in a
process, its exit status and output (the commands themselves are tested
in-process in tests/unit/test_cli.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_console_script_entry_point():
    exe = Path(sys.executable).with_name("depthbench")
    if not exe.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    proc = subprocess.run(
        [str(exe), "shapes", "--suite", "paper-400m"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("suite paper-400m:")
    assert lines[3].split()[:3] == ["16", "1216", "3248"]
    bad = subprocess.run(
        [str(exe), "shapes", "--suite", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stdout == ""
