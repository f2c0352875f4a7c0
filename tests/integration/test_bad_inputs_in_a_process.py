"""Bad input in a real process, where what a user sees on stderr is all there is:
the cases of :data:`bad_input_commands.PROCESS_CASES` (logging configured as a
user's is) and :data:`bad_input_commands.ENV_PROCESS_CASES` (variables read as the
package is imported) give one line, exit status 2 and leave the disk as it was
(every case in-process: tests/unit/test_bad_inputs_commands.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from bad_input_commands import (
    CASES,
    ENV_CASES,
    ENV_PROCESS_CASES,
    PROCESS_CASES,
    one_line,
    unchanged,
)
from fast_xla import subprocess_flags


@pytest.mark.slow  # real processes: start-up
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in PROCESS_CASES],
                         ids=lambda c: c[0])
def test_bad_input_in_a_process(case, disk, tmp_path):
    name, argv, pattern = case
    if name.startswith("lm-eval"):
        pytest.importorskip("lm_eval")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": subprocess_flags(),
           "HF_HOME": str(tmp_path / "home"), "HF_DATASETS_OFFLINE": "1"}
    result = {}

    def run() -> str:
        proc = subprocess.run([sys.executable, "-m", "depthbench", *argv(disk)], env=env,
                              capture_output=True, text=True, timeout=300)
        result["code"], result["out"] = proc.returncode, proc.stdout
        return proc.stderr

    err = unchanged(disk, run)
    one_line(result["code"], result["out"], err, pattern)  # no absl/Orbax line, no traceback


@pytest.mark.slow  # real processes: start-up
@pytest.mark.parametrize("case", [c for c in ENV_CASES if c[0] in ENV_PROCESS_CASES],
                         ids=lambda c: c[0])
def test_bad_environment_in_a_process(case, disk, tmp_path):
    """Variables read as the package is imported ($DEPTHBENCH_FAMILIES) or before the
    command runs: one line, exit 2, no traceback, the disk as it was."""
    _, variables, argv, pattern = case
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": subprocess_flags(),
           "PYTHONPATH": os.pathsep.join([str(disk / "plugins"), *filter(None, [
               os.environ.get("PYTHONPATH")])]), **variables(disk)}
    result = {}

    def run() -> str:
        proc = subprocess.run([sys.executable, "-m", "depthbench", *argv(disk)], env=env,
                              capture_output=True, text=True, timeout=300, cwd=disk)
        result["code"], result["out"] = proc.returncode, proc.stdout
        return proc.stderr

    err = unchanged(disk, run)
    one_line(result["code"], result["out"], err, pattern)
