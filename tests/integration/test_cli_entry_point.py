"""The ``depthbench`` console script, as installed: one run of the command in a
process, its exit status and output (the commands themselves are tested
in-process in tests/unit/test_cli.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _run(exe: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_console_script_entry_point():
    exe = Path(sys.executable).with_name("depthbench")
    if not exe.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    proc = _run(exe, "shapes", "--suite", "paper-400m")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("suite paper-400m:")
    assert lines[3].split()[:3] == ["16", "1216", "3248"]
    bad = _run(exe, "shapes", "--suite", "nope")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stdout == ""
