"""A newcomer's first hour (issue 16), the papercuts of the launch scripts, each
pinned by a test that runs the script (the in-process ones:
tests/unit/test_newcomer.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from paths import REPO

from depthbench.cli import main as cli_main

# ------------------------------------------------ 2. gpu_sweep dry run


def _gpu(tmp_path, *args):
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "sbatch").write_text(f"#!{sys.executable}\nimport sys\n"
                                 f"open({str(tmp_path / 'sbatch.log')!r}, 'a').write(' '.join("
                                 "sys.argv[1:]) + '\\n')\n")
    (fake / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
           "DEPTHBENCH": f"{sys.executable} -m depthbench", "HOME": str(tmp_path)}
    env.pop("DEPTHBENCH_OVERRIDES", None)
    return subprocess.run(["bash", str(REPO / "launch" / "gpu_sweep.sh"), *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)


def test_gpu_dry_run_needs_no_venv_and_lists_every_step(tmp_path):
    r = _gpu(tmp_path, "--config", "experiments/quickstart.py", "--workdir", str(tmp_path / "w"),
             "--nodes", "2", "--venv", str(tmp_path / "venvs" / "none"), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "realpath" not in r.stderr and not (tmp_path / "sbatch.log").exists()
    lines = r.stdout.splitlines()
    assert lines[1].startswith("+ sbatch ") and f"--venv {tmp_path}/venvs/none --" in lines[1]
    steps = [ln for ln in lines if ln.startswith("+ srun ")]
    names = re.findall(r"--run (\S+) ", "\n".join(steps))
    assert len(names) == 15 and names[0] == "pre_ln-L2-lr3e-03"  # quickstart: 5 designs x 3
    assert all("--nodes 2" in s for s in steps) and lines[-1].endswith(f"report {tmp_path}/w")
    assert "dry run: 15 runs listed, nothing was run" in r.stderr


def test_gpu_submit_with_a_missing_venv_is_one_line_exit_2(tmp_path):
    r = _gpu(tmp_path, "--config", "experiments/quickstart.py", "--workdir", str(tmp_path / "w"),
             "--venv", str(tmp_path / "none"))
    assert r.returncode == 2 and not (tmp_path / "sbatch.log").exists()
    assert r.stderr.strip().splitlines() == [
        f"gpu_sweep.sh: error: --venv: '{tmp_path / 'none'}' is not a virtualenv "
        "(no bin/activate); create it first"]


# ------------------------------------------------ 6. dry runs check the data


def test_launcher_dry_runs_flag_missing_data(tmp_path):
    env = {**os.environ, "DEPTHBENCH": f"{sys.executable} -m depthbench", "HOME": str(tmp_path)}
    env.pop("DEPTHBENCH_OVERRIDES", None)
    for script, extra in (("tpu_sweep.sh", ["--workdir", "gs://b/x", "--tpu", "t", "--zone", "z"]),
                          ("gpu_sweep.sh", ["--workdir", str(tmp_path / "w")])):
        r = subprocess.run(["bash", str(REPO / "launch" / script), "--config",
                            "experiments/paper_400m.py", *extra, "--dry-run"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (script, r.stderr)
        assert "depthbench: error: config.data.paths: empty" in r.stderr, script
        assert "+ srun" not in r.stdout and "tpu-vm ssh" not in r.stdout


# ------------------------------------------------ 10. docs match the code


def test_every_command_and_launcher_help_has_examples(capsys):
    for command in ("shapes", "costs", "families", "data", "train", "sweep", "report"):
        with pytest.raises(SystemExit):
            cli_main([command, "--help"])
        assert "examples:" in capsys.readouterr().out, command
    for script in ("tpu_sweep.sh", "gpu_sweep.sh", "local_sweep.sh"):
        r = subprocess.run(["bash", str(REPO / "launch" / script), "--help"],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "\nexamples:\n  launch/" + script in r.stdout, script
