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


# Commands whose work needs none of jax, flax, Orbax or grain (a second of start-up
# each): the parser builds only the named command, and what these import stays
# clear of the model and the pipeline.
LIGHT = {
    "shapes": ["shapes", "--suite", "paper-400m"],
    "data tokenize (bad input)": ["data", "tokenize", "--input", "a.jsonl", "--out", "o",
                                  "--tokenizer", "t.json", "--workers", "0"],
    "data tokenize --help": ["data", "tokenize", "--help"],
}
PROBE = """\
import sys
from depthbench.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:  # --help
    code = e.code
heavy = sorted(m for m in ("jax", "flax", "orbax.checkpoint", "grain", "optax", "torch")
               if m in sys.modules)
print("HEAVY", ",".join(heavy))
sys.exit(code)
"""


@pytest.mark.parametrize("argv", LIGHT.values(), ids=LIGHT)
def test_light_commands_import_no_jax(argv, tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, timeout=120, check=False, cwd=tmp_path)
    assert proc.returncode in (0, 2), proc.stderr
    assert proc.stdout.splitlines()[-1] == "HEAVY ", proc.stdout[-500:]


def test_a_heavy_command_still_imports_the_model(tmp_path):
    """The probe can see an import: ``families`` lists the registry's families."""
    proc = subprocess.run([sys.executable, "-c", PROBE, "families"], capture_output=True,
                          text=True, timeout=120, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("HEAVY flax,jax"), proc.stdout[-500:]


# A command that fails on a full disk while an Orbax save's writes are pending: the
# coroutines it abandoned are still in a reference cycle when Python shuts down.
_ABANDONED_SAVE = """
import gc, sys
from depthbench import cli, faults
gc.disable()

def main():
    async def write_fragment():
        pass
    class Pending:
        pass
    pending = Pending()
    pending.write, pending.self = write_fragment(), pending
    sys.stderr.write("depthbench: error: checkpoints: could not write step 4\\n")
    return faults.EXIT_STORAGE

cli.main = main
cli.entry()
"""


def test_a_storage_error_is_one_line_with_writes_abandoned_at_exit():
    """After the one line, nothing: Python's "coroutine ... was never awaited"
    warning at shutdown (seen under load when a full disk stopped a save) is
    silenced for the commands that end in an error they already explained."""
    proc = subprocess.run([sys.executable, "-c", _ABANDONED_SAVE], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 4
    assert proc.stderr == "depthbench: error: checkpoints: could not write step 4\n"
