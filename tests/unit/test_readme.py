"""The executable README: every command block of README.md and docs/*.md runs as written.

Each Markdown file is split into independent parts (its ``## `` sections, joined
where one names a run directory, ``~/`` path or written file of another:
``readme_blocks.parts``), one test each, so pytest-xdist can spread them.  Each
part gets a sandbox directory shaped like a checkout (copies of experiments/,
launch/, docs/, README.md; ``.venv`` pointing at this test's virtualenv) and its
blocks run there in document order, so a later block sees what an earlier one
made (``report runs/quickstart`` after the sweep).  To keep
the whole set to a few minutes, every command runs with

    DEPTHBENCH_OVERRIDES='train.steps=3'   (every config: 3 training steps)
    DEPTHBENCH_MAX_RUNS=1                  (a sweep process trains at most 1 run)

both documented in ``depthbench --help``; cloud tools (gcloud, sbatch, srun,
scontrol) are fakes on PATH that record their arguments, so the launchers run
as they would on a workstation with no cluster behind it.  Outputs shown in
``console`` blocks are compared with the real output.  A block that cannot run
here is marked in the Markdown itself (``<!-- readme-test: skip: REASON -->``)
and is the only kind skipped; a command naming a sub-command or flag that does
not exist fails (argparse's exit status 2), it is never skipped.  See
tests/readme_blocks.py for the block grammar.
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
from paths import REPO
from readme_blocks import Block, Command, parse, parts, problem

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]'"
SMOKE_ENV = {"DEPTHBENCH_OVERRIDES": "train.steps=3", "DEPTHBENCH_MAX_RUNS": "1"}
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


def _blocks(doc: Path) -> list[Block]:
    return parse(doc, REPO)


# ------------------------------------------------------------------ fast checks


def test_every_block_is_runnable_or_marked():
    problems = [f"{b.where}: {why}" for doc in DOCS for b in _blocks(doc)
                if (why := problem(b)) is not None]
    assert not problems, "\n".join(problems)
    commands = sum(len(b.commands()) for doc in DOCS for b in _blocks(doc) if b.skip is None)
    assert commands >= 20  # the README alone documents more than this


def test_block_grammar(tmp_path):
    md = tmp_path / "x.md"
    md.write_text(
        "text\n\n```bash\ndepthbench a \\\n    --b c   # fine\n# a comment\n"
        "depthbench d   # exit status 2\n```\n\n"
        "<!-- readme-test: skip: needs a TPU -->\n```bash\ngcloud x\n```\n"
        "<!-- readme-test: run: touch y -->\n"
        "```console\n$ depthbench e\nline 1  \n\n$ depthbench f\n```\n"
        "```python\n# experiments/z.py\nx = 1\n```\n```\nuntagged\n```\n")
    blocks = parse(md, tmp_path)
    assert [b.lang for b in blocks] == ["bash", "bash", "bash", "console", "python", ""]
    first = blocks[0].commands()
    assert [(c.text, c.expect_status) for c in first] == [
        ("depthbench a      --b c   # fine", 0), ("depthbench d   # exit status 2", 2)]
    assert blocks[1].skip == "needs a TPU" and blocks[2].hidden and blocks[2].body == "touch y"
    shown = blocks[3].commands()
    assert [(c.text, c.expect_output) for c in shown] == [("depthbench e", ["line 1"]),
                                                          ("depthbench f", [])]
    assert blocks[4].file == "experiments/z.py" and problem(blocks[4]) is None
    assert "untagged" not in (problem(blocks[5]) or "") and problem(blocks[5]) is not None


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (REPO / ".ci" / "run").read_text()
    ci_command = [ln for ln in ci.splitlines() if "pytest" in ln and not ln.startswith("#")]
    assert len(ci_command) == 1 and ci_command[0].startswith(INSTALL + " && ")
    shown = [c.text for b in _blocks(REPO / "README.md") for c in b.commands()]
    assert ci_command[0].strip() in shown


def test_local_links_and_images_resolve():
    """Every relative link and image of README.md and docs/ names a committed path
    (the README links the measurement logs in bench/results/ and the docs)."""
    broken, images = [], 0
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # code is not links
        for bang, target in re.findall(r"(!?)\[[^\]]*\]\(([^)\s]+)\)", text):
            images += bool(bang)
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):
                continue  # an anchor on the same page, or a URL
            if not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert not broken, "\n".join(broken)
    assert images >= 1  # the quickstart plot


def test_readme_keeps_no_measurement_log():
    """The README is a user's document: measurement logs with their times of day, and
    counts or times of the test suite that would need rewriting by hand after every
    change, belong in bench/results/*.md (the README links them)."""
    readme = (REPO / "README.md").read_text()
    assert not re.findall(r"\b\d{1,2}:\d{2} UTC", readme)
    assert not re.findall(r"\b\d[\d,]* (?:tests|passed)\b", readme)
    assert not re.findall(r"\b\d+ min \d+ s\b", readme)
    assert "bench/results/" in readme


# ------------------------------------------------------------ running them


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


def _as_run(command: Command, where: str) -> str:
    """The README's install prefix is what CI runs before the tests (checked above);
    here the package is installed already, so the rest of the command runs."""
    text = command.text
    if text.startswith(INSTALL):
        assert INSTALL in (REPO / ".ci" / "run").read_text(), where
        text = text[len(INSTALL):].lstrip()
        assert text.startswith("&& "), f"{where}: {command.text!r}"
        text = text[3:]
    return text


def _run(block: Block, command: Command, root: Path, env: dict) -> float:
    """Run one command; returns its wall time in seconds."""
    text = _as_run(command, block.where)
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
    return [(d, i) for d in DOCS for i in range(len(parts(_blocks(d))))]


def _part_id(case: tuple[Path, int]) -> str:
    doc, i = case
    section = parts(_blocks(doc))[i][0].section
    slug = re.sub(r"[^a-z0-9]+", "-", section.lower()).strip("-")
    return str(doc.relative_to(REPO)) + (f"#{slug}" if slug else "")


def test_parts_cover_every_runnable_block_once():
    """Splitting a document into parts drops no block, repeats none and keeps the
    document's order within each part; a part that reads what another leaves behind
    (README: ``report runs/quickstart`` after the first sweep) is the same part."""
    for doc in DOCS:
        blocks = _blocks(doc)
        runnable = [b.line for b in blocks if b.skip is None and (b.file or b.commands())]
        split = parts(blocks)
        lines = [b.line for part in split for b in part]
        assert sorted(lines) == runnable, doc
        for part in split:
            assert [b.line for b in part] == sorted(b.line for b in part), doc
    readme = parts(_blocks(REPO / "README.md"))
    assert len(readme) >= 2
    [quickstart] = [p for p in readme if any("report runs/quickstart" in b.body for b in p)]
    assert any("sweep --config experiments/quickstart.py --workdir runs/quickstart" in b.body
               and "--dry-run" not in b.body for b in quickstart)
    [more] = [p for p in readme if any(b.file == "experiments/paper_400m_more.py" for b in p)]
    assert any("experiments/paper_400m_more.py" in b.body for b in more if b.commands())


@pytest.mark.slow
@pytest.mark.parametrize("case", _runnable_parts(), ids=_part_id)
def test_documented_commands_run_as_written(case, tmp_path):
    doc, index = case
    root = tmp_path / "checkout"
    root.mkdir()
    env = _sandbox(root)
    timings = []
    for block in parts(_blocks(doc))[index]:
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


def test_marked_blocks_name_a_reason():
    marked = [(b.where, b.skip) for doc in DOCS for b in _blocks(doc) if b.skip is not None]
    for where, reason in marked:
        assert len(reason.split()) >= 3, f"{where}: say why it cannot run here: {reason!r}"
