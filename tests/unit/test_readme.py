"""The README and docs/*.md, checked without running a command: every command
block runnable or marked, the block grammar, CI running the README's test
command verbatim, the main job installing the package alone, local links, no
measurement log in the README, the parts the command tests run (the commands
themselves: tests/integration/test_readme_commands.py)."""

from __future__ import annotations

import re

import core_only
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from paths import REPO
from readme_blocks import CORE_INSTALL, DOCS, INSTALL, parse, parts, problem, project_blocks

# ------------------------------------------------------------------ fast checks


def test_every_block_is_runnable_or_marked():
    problems = [f"{b.where}: {why}" for doc in DOCS for b in project_blocks(doc)
                if (why := problem(b)) is not None]
    assert not problems, "\n".join(problems)
    commands = sum(len(b.commands()) for doc in DOCS for b in project_blocks(doc) if b.skip is None)
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
    shown = [c.text for b in project_blocks(REPO / "README.md") for c in b.commands()]
    assert ci_command[0].strip() in shown


def test_the_main_job_installs_the_package_alone():
    """README's main job installs what it uses (no extra); the command test runs it with
    the extras hidden (tests/helpers/core_only.py)."""
    shown = [c.text for b in project_blocks(REPO / "README.md") for c in b.commands()]
    [main] = [t for t in shown if "sweep --config experiments/quickstart.py" in t
              and "--dry-run" not in t]
    assert main.startswith(CORE_INSTALL + " && .venv/bin/depthbench sweep "), main


def test_the_core_install_hides_every_extra_and_no_dependency():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = core_only.core_distributions()
    for line in project["dependencies"]:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            assert canonicalize_name(req.name) in core, req.name
    modules, distributions = core_only.extra_only()
    assert {"torch", "transformers", "lm_eval", "wandb", "pytest", "nbclient"} <= set(modules)
    assert {"torch", "transformers", "lm-eval", "ai2-olmo-core"} <= set(distributions)
    assert not {"jax", "flax", "numpy", "tensorboardX", "google", "google.protobuf",
                "depthbench", "pallas_kernels", "pip"} & set(modules)
    assert not core & set(distributions)


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


# ------------------------------------------------ the parts the command tests run


def test_parts_cover_every_runnable_block_once():
    """Splitting a document into parts drops no block, repeats none and keeps the
    document's order within each part; a part that reads what another leaves behind
    (README: ``report runs/quickstart`` after the first sweep) is the same part."""
    for doc in DOCS:
        blocks = project_blocks(doc)
        runnable = [b.line for b in blocks if b.skip is None and (b.file or b.commands())]
        split = parts(blocks)
        lines = [b.line for part in split for b in part]
        assert sorted(lines) == runnable, doc
        for part in split:
            assert [b.line for b in part] == sorted(b.line for b in part), doc
    readme = parts(project_blocks(REPO / "README.md"))
    assert len(readme) >= 2
    [quickstart] = [p for p in readme if any("report runs/quickstart" in b.body for b in p)]
    assert any("sweep --config experiments/quickstart.py --workdir runs/quickstart" in b.body
               and "--dry-run" not in b.body for b in quickstart)
    [more] = [p for p in readme if any(b.file == "experiments/paper_400m_more.py" for b in p)]
    assert any("experiments/paper_400m_more.py" in b.body for b in more if b.commands())


def test_marked_blocks_name_a_reason():
    marked = [(b.where, b.skip) for doc in DOCS for b in project_blocks(doc) if b.skip is not None]
    for where, reason in marked:
        assert len(reason.split()) >= 3, f"{where}: say why it cannot run here: {reason!r}"
