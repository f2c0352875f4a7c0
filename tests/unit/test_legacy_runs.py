"""Run directories written by main before the run-directory layer still work.

tests/fixtures/legacy_runs/ holds run directories written by that code
(make_legacy_runs.py says how): an interrupted run and a finished sweep of
two families whose config.json files hold every family's residual fields.
The interrupted run resumes to the losses of an uninterrupted run of this
code, bitwise; the finished sweep is skipped (not a byte of its runs
changes); load_run, the analyses and the reports read them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import paths
import pytest
from toy_corpus import write_progressions

from depthbench import config as config_lib
from depthbench.analysis.analyze import analyze
from depthbench.cli import main as cli_main
from depthbench.digest import file_sha256 as file_digest
from depthbench.run import load_run
from depthbench.rundir.io import read_jsonl
from depthbench.train import loop

FIXTURES = paths.FIXTURES / "legacy_runs"
SPEC = FIXTURES / "legacy_spec.py"


@pytest.fixture()
def legacy(tmp_path, monkeypatch) -> Path:
    """A copy of the fixtures as the working directory, with the shard their spec reads."""
    root = tmp_path / "legacy"
    shutil.copytree(FIXTURES, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.chdir(root)
    write_progressions(root / "shard.npy", 300)
    return root


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    return {p.relative_to(root).as_posix(): (p.stat().st_size, file_digest(p))
            for p in sorted(root.rglob("*")) if p.is_file()}


def _losses(run_dir: Path) -> list[tuple]:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return [(r["step"], r["loss"], r.get("val_loss")) for r in rows]


def test_the_fixtures_are_what_main_wrote():
    """Every family's residual fields, per-block statistics in TensorBoard only, a
    checkpoint at step 2 with the log running on to step 4, no result."""
    hc = json.loads((FIXTURES / "sweep" / "hc" / "config.json").read_text())
    assert len(hc["model"]["residual"]) == 19 and "moda_kv_heads" in hc["model"]["residual"]
    assert not (FIXTURES / "sweep" / "hc" / "layer_stats.jsonl").exists()
    run = FIXTURES / "interrupted"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2"]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3, 4]
    assert not (run / "result.json").exists()


def test_an_interrupted_legacy_run_resumes_bitwise(legacy, capsys):
    config = config_lib.load(SPEC)
    resumed = loop.run(config, legacy / "interrupted", progress=False)
    assert f"resuming {legacy / 'interrupted'} from step 2" in capsys.readouterr().err
    fresh = loop.run(config, legacy / "fresh", progress=False)
    assert resumed["status"] == fresh["status"] == "finished"
    assert _losses(legacy / "interrupted") == _losses(legacy / "fresh")  # floats compared with ==
    assert resumed["final_val_loss"] == fresh["final_val_loss"]
    assert resumed["final_train_loss"] == fresh["final_train_loss"]


def test_a_finished_legacy_sweep_is_skipped(legacy, capsys):
    """Its pre_ln run is skipped; its hc run read out norm-then-sum, hc's default
    then, and plain ``hc`` means the original's final sum-then-norm now (issue 38):
    the sweep says so in one line and changes nothing, rather than file the old run
    under the new meaning."""
    runs = {name: _snapshot(legacy / "sweep" / name) for name in ("pre_ln", "hc")}
    assert cli_main(["sweep", "--config", str(SPEC), "--workdir", "sweep", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("depthbench: error: run 'hc' in 'sweep' was started with a different "
                   "config: model.residual.readout 'norm_then_sum' -> 'sum_then_norm'; use a "
                   "new --workdir or delete 'sweep/hc'")
    only_pre_ln = legacy / "pre_ln_spec.py"
    only_pre_ln.write_text(SPEC.read_text().replace(', {"model.family": "hc"}', ""))
    assert cli_main(["sweep", "--config", str(only_pre_ln), "--workdir", "sweep",
                     "--no-progress"]) == 0
    assert "1 run: 1 done" in capsys.readouterr().out
    for name, before in runs.items():  # not retrained: not a byte changed
        assert _snapshot(legacy / "sweep" / name) == before, name


def test_legacy_runs_are_read_by_load_run_the_analyses_and_the_reports(legacy, capsys):
    run = load_run(legacy / "sweep" / "hc")
    assert (run.step, run.spec.family, run.depth) == (4, "hc", 2)
    tokens = np.load(legacy / "shard.npy")[:32].astype(np.int32).reshape(2, 16)
    result = analyze(run, tokens, ["angular_distance"], progress=False)
    assert np.isfinite(result["meta"]["loss"]) and result["meta"]["step"] == 4

    capsys.readouterr()
    assert cli_main(["report", "sweep", "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # nothing damaged, nothing to warn about
    results = {n: json.loads((legacy / "sweep" / n / "result.json").read_text())
               for n in ("pre_ln", "hc")}
    md = (legacy / "sweep" / "report.md").read_text()
    assert "2 runs: 2 done." in md
    for name, r in results.items():
        assert f"| {name} | {name} | 2 | 8.0 | 1e-02 |" in md
        assert f"{r['final_val_loss']:.4f}" in md

    assert cli_main(["report", "sweep/hc", "--no-plots"]) == 0
    text = (legacy / "sweep" / "hc" / "report.md").read_text()
    assert "status            finished" in text
    assert "none in layer_stats.jsonl" in text and "TensorBoard only" in text
