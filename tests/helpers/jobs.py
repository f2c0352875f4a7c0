"""Waiting for a test's subprocess: its output, or a failed test when it hangs."""

from __future__ import annotations

import subprocess

import pytest


def communicate_or_fail(proc: subprocess.Popen, timeout: float, what: str) -> tuple[str, str]:
    """``proc``'s (stdout, stderr) once it exits; past ``timeout`` seconds it is
    killed (and reaped) and the test fails naming ``what``."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{what} timed out")
