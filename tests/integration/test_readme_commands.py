"""The executable README: every command block of README.md and docs/*.md runs as written.

Each Markdown file is split into independent parts (its ``## `` sections, joined
where one names a run directory, ``~/`` path or written file of another:
``readme_blocks.parts``), one test each, so pytest-xdist can spread them.  Each
part gets a sandbox directory shaped like a checkout (copies of experiments/,
launch/, docs/, README.md; ``.venv`` pointing at this test's virtualenv) and its
blocks run there in document order, so a later block sees what an earlier one
made (``report runs/quickstart`` after the sweep).  To keep
the whole set to a few minutes, every command runs with

    DEPTHBENCH_OVERRIDES='train.steps=3 data.val_windows=8 train.batch_size=2 train.seq_len=32'
                              (every config: 3 training steps of 2 x 32 tokens,
                              8 validation windows)
    DEPTHBENCH_MAX_RUNS=1     (a sweep process trains at most 1 run)

both documented in ``depthbench --help``.  The README's install prefixes are
taken as done (the test environment has the dev extra); after the main job's,
which installs the package alone, the rest of its part runs with the extras'
modules hidden (tests/helpers/core_only.py), so a documented command that needs
an extra the reader did not install fails here.  Cloud tools (gcloud, sbatch, srun,
scontrol) are fakes on PATH that record their arguments, so the launchers run
as they would on a workstation with no cluster behind it.  Outputs shown in
``console`` blocks are compared with the real output.  A block that cannot run
here is marked in the Markdown itself (``<!-- readme-test: skip: REASON -->``)
and is the only kind skipped; a command naming a sub-command or flag that does
not exist fails (argparse's exit status 2), it is never skipped.  See
tests/helpers/readme_blocks.py for the block grammar, and tests/unit/test_readme.py for
the checks that need no command run (every block runnable or marked, links,
CI's command).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from core_only import hide_extras
from paths import REPO
from readme_blocks import CORE_INSTALL, DOCS, INSTALL, Block, Command, parts, project_blocks

SMOKE_ENV = {"DEPTHBENCH_OVERRIDES": ("train.steps=3 data.val_windows=8 train.batch_size=2 "
                                      "train.seq_len=32"),
             "DEPTHBENCH_MAX_RUNS": "1"}
COMMAND_TIMEOUT_S = 600

# Fake cloud tools (bash: hundreds of calls stay cheap): each records its argv in
# $FAKE_DIR/calls.log; gcloud plays a slice that exists once created.
FAKE_TOOL = r"""#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$FAKE_DIR/calls.log"
state="$FAKE_DIR/tpu_state"
case "$(basename "$0") $1 $2 $3 $4" in
  "gcloud compute tpus tpu-vm describe") [[ -f "$state" ]] || exit 1; cat "$state" ;;
  "gcloud compute tpus tpu-vm create") echo READY > "$state" ;;
  "gcloud compute tpus tpu-vm delete") rm -f "$state" ;;
  "gcloud storage ls"*) exit 1 ;;  # no finished runs in the bucket
  sbatch*) echo "Submitted batch job 4242" ;;
  scontrol*) echo node-a ;;
esac
exit 0
"""


def _sandbox(root: Path) -> dict[str, str]:
    """A checkout-shaped directory to run documented commands in; returns the env."""
    for name in ("experiments", "launch", "docs"):
        shutil.copytree(REPO / name, root / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(REPO / "README.md", root / "README.md")
    (root / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    bin_dir = root / ".fakebin"
    bin_dir.mkdir()
    for tool in ("gcloud", "sbatch", "srun", "scontrol"):
        path = bin_dir / tool
        path.write_text(FAKE_TOOL)
        path.chmod(0o755)
    home = root / ".home"
    home.mkdir()
    cache = os.environ.get("DEPTHBENCH_CACHE") or str(Path.home() / ".cache" / "depthbench")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TPU_", "SLURM_", "DEPTHBENCH", "JAX_COORDINATOR"))}
    env.update(SMOKE_ENV)
    env.update(FAKE_DIR=str(root), HOME=str(home), DEPTHBENCH_CACHE=cache, JAX_PLATFORMS="cpu",
               PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent),
                                     os.environ["PATH"]]))
    return env


def _as_run(command: Command, where: str, root: Path, env: dict) -> str:
    """The README's install prefixes are done here already, so the rest of the command
    runs: the tests' (the dev extra) is what CI runs before the tests (checked here);
    after the main job's (the package alone) the part's commands run with every module
    only an extra installs hidden (tests/helpers/core_only.py), as in the environment
    that install makes."""
    text = command.text
    for prefix in (INSTALL, CORE_INSTALL):
        if not text.startswith(prefix):
            continue
        assert text.startswith(prefix + " && "), f"{where}: {command.text!r}"
        if prefix == INSTALL:
            assert INSTALL in (REPO / ".ci" / "run").read_text(), where
        else:
            _hide_extras(root, env)
        return text[len(prefix) + len(" && "):]
    return text


def _hide_extras(root: Path, env: dict) -> None:
    """Put the core install's view first on ``PYTHONPATH`` in ``env``, and check that
    it hides an extra's module (torch) and not a dependency's (jax)."""
    folder = hide_extras(root / ".core-only")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    probe = ("import importlib.util as u, sys; "
             "sys.exit(u.find_spec('torch') is not None or u.find_spec('jax') is None)")
    assert subprocess.run([sys.executable, "-c", probe], env=env).returncode == 0


def _run(block: Block, command: Command, root: Path, env: dict) -> float:
    """Run one command; returns its wall time in seconds."""
    text = _as_run(command, block.where, root, env)
    start = time.perf_counter()
    r = subprocess.run(["bash", "-c", text], cwd=root, env=env, capture_output=True, text=True,
                       timeout=COMMAND_TIMEOUT_S)
    detail = (f"{block.where}: `{command.text}` exited {r.returncode} "
              f"(expected {command.expect_status})\n--- stdout\n{r.stdout[-3000:]}\n"
              f"--- stderr\n{r.stderr[-3000:]}")
    assert r.returncode == command.expect_status, detail
    if command.expect_output is not None:
        got = [ln.rstrip() for ln in r.stdout.splitlines()]
        while got and not got[-1]:
            got.pop()
        assert got == command.expect_output, (
            f"{block.where}: the output of `{command.text}` differs from the one shown:\n"
            + "\n".join(f"shown: {a!r}\n  got: {b!r}" for a, b in
                        zip(command.expect_output + [""] * len(got),
                            got + [""] * len(command.expect_output), strict=False)
                        if a != b)[:4000])
    return time.perf_counter() - start


def _runnable_parts() -> list[tuple[Path, int]]:
    return [(d, i) for d in DOCS for i in range(len(parts(project_blocks(d))))]


def _part_id(case: tuple[Path, int]) -> str:
    doc, i = case
    section = parts(project_blocks(doc))[i][0].section
    slug = re.sub(r"[^a-z0-9]+", "-", section.lower()).strip("-")
    return str(doc.relative_to(REPO)) + (f"#{slug}" if slug else "")


@pytest.mark.slow
@pytest.mark.parametrize("case", _runnable_parts(), ids=_part_id)
def test_documented_commands_run_as_written(case, tmp_path):
    doc, index = case
    root = tmp_path / "checkout"
    root.mkdir()
    env = _sandbox(root)
    timings = []
    for block in parts(project_blocks(doc))[index]:
        if block.file:
            target = root / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body + "\n")
            continue
        for command in block.commands():
            timings.append((_run(block, command, root, env), block.where, command.text[:70]))
    assert timings
    print(f"\n{sum(t for t, *_ in timings):.0f} s in all; slowest:")  # shown with pytest -s
    for seconds, where, text in sorted(timings, reverse=True)[:8]:
        print(f"{seconds:6.1f} s  {where}  {text}")
