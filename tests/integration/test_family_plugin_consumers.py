"""A family from outside the package, named in DEPTHBENCH_FAMILIES, is picked up
by every consumer in processes of its own: `depthbench families` and `costs`,
the shared family tests and `depthbench train` (in-process registration:
tests/unit/test_family_plugin.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO
from toy_family_source import TOY


def _env(tmp_path: Path) -> dict:
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, DEPTHBENCH_FAMILIES="toy_family")


@pytest.mark.slow
def test_every_consumer_picks_up_a_registered_family(tmp_path):
    (tmp_path / "toy_family.py").write_text(TOY)
    env = _env(tmp_path)
    cli = [sys.executable, "-m", "depthbench"]

    def run(*args, **kw):
        out = subprocess.run([*args], env=env, capture_output=True, text=True, timeout=600,
                             **kw)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        return out.stdout

    families = {r["name"]: r for r in json.loads(run(*cli, "families", "--json"))}
    assert families["toy_scaled"]["extra_block_params"] == 2
    rows = json.loads(run(*cli, "costs", "--suite", "micro", "--depths", "4", "--seq-len", "128",
                          "--family", "toy_scaled", "--json"))
    assert [r["family"] for r in rows] == ["toy_scaled"]
    # The shared family tests, parametrised over the registry, run on it.  (The
    # sharded-vs-single-device check loops over registry.names() in one 8-device
    # subprocess that inherits DEPTHBENCH_FAMILIES; it is left out here only for
    # time: it would run all fourteen families.)
    shared = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                 "no:xdist", str(REPO / "tests" / "unit" / "test_families_shared.py"),
                 "-k", "toy_scaled", cwd=REPO)
    passed = int(shared.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert passed >= 9, shared[-1000:]
    workdir = tmp_path / "run"
    run(*cli, "train", "--config", "micro", "--workdir", str(workdir), "--no-progress",
        "--config.model.residual.toy_scale=0.25", "--config.model.family=toy_scaled",
        "--config.train.steps=3", "--config.train.batch_size=4", "--config.train.seq_len=32",
        "--config.train.eval_every=3", "--config.train.checkpoint_every=3",
        "--config.train.layer_stats_every=0", "--config.data.val_windows=4")
    result = json.loads((workdir / "result.json").read_text())
    assert result["family"] == "toy_scaled" and result["status"] == "finished"
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"]["residual"] == {"toy_scale": 0.25, "toy_gain_init": 1.0}
