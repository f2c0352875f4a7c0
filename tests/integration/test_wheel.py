"""depthbench works from a wheel, not only from a checkout: build it, install it
into a fresh virtual environment, and train from an unrelated directory.

The wheel is built from a copy of the checkout's files (setuptools writes
``build/`` and ``*.egg-info`` beside the sources it builds), so the test leaves
nothing in the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from paths import REPO


def _can_build_in_place() -> bool:
    """Whether this environment has what pyproject's build-system asks for
    (else pip builds in an isolated environment fetched from the index)."""
    try:
        import setuptools
        from setuptools.command import bdist_wheel  # noqa: F401 (setuptools >= 70.1)
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 68


def _run(args, **kw) -> str:
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, **kw)
    assert out.returncode == 0, f"{args}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out.stdout


def _copy_of_the_checkout(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and new ones not ignored;
    no build outputs, virtual environments or runs) copied to ``dest``."""
    listed = _run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                   "--exclude-standard"])
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # not a file deleted from the work tree but still in the index
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.slow
def test_wheel_installs_and_trains_from_an_unrelated_directory(tmp_path):
    dist = tmp_path / "dist"
    in_place = ["--no-build-isolation"] if _can_build_in_place() else []
    sources = _copy_of_the_checkout(tmp_path / "checkout")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *in_place,
          "-w", str(dist), str(sources)])
    (wheel,) = dist.glob("depthbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for member in ("depthbench/configs/base.py", "depthbench/configs/quickstart.py",
                   "depthbench/configs/micro.py", "depthbench/errors.py"):
        assert member in names, member
    assert not any(n.startswith(("experiments/", "tests/")) for n in names)

    # A fresh venv whose own site-packages comes first and that sees this
    # environment's dependencies through .pth lines (no downloads): every
    # site-packages directory on this interpreter's path.  The checkout's
    # editable install is a .pth file *inside* one of them, which Python does
    # not process for a directory added this way; src/ itself is left out.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                         "['purelib'])"]).strip())
    deps = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    assert sysconfig.get_paths()["purelib"] in deps
    (site / "deps.pth").write_text("".join(f"{p}\n" for p in deps))
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DEPTHBENCH_FAMILIES")}
    where = _run([str(python), "-c", "import depthbench; print(depthbench.__file__)"],
                 cwd=elsewhere, env=env)
    assert where.startswith(str(site)), where  # the installed copy, not the checkout
    _run([str(venv / "bin" / "depthbench"), "train", "--config", "micro", "--workdir", "run",
          "--no-progress", "--config.train.steps=3", "--config.train.batch_size=4",
          "--config.train.seq_len=32", "--config.train.eval_every=3",
          "--config.train.checkpoint_every=3", "--config.train.layer_stats_every=0",
          "--config.data.val_windows=4"], cwd=elsewhere, env=env)
    result = json.loads((elsewhere / "run" / "result.json").read_text())
    assert result["status"] == "finished" and result["steps"] == 3
    assert result["final_val_loss"] > 0
