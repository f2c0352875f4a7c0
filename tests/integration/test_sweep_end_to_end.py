"""A real sweep end to end, in-process: two tiny models on the real micro corpus
trained, recorded in results.csv, skipped when run again, and reported (the
sweep's logic with fake trainers: tests/unit/test_sweep.py)."""

from __future__ import annotations

import json
import signal

import pytest
from sweep_spec import read_csv, tiny_config

from depthbench.cli import main as cli_main

TINY = f"""
from depthbench.config import base_config

def get_config():
{tiny_config(checkpoint_every=2, layer_stats_every=4)}    return c

def get_sweep():
    return [{{"model.family": f, "model.depth": 2}} for f in ("pre_ln", "hc")]
"""


@pytest.mark.slow
def test_real_sweep_end_to_end(tmp_path, capsys):
    spec = tmp_path / "tiny_real.py"
    spec.write_text(TINY)
    workdir = tmp_path / "w"
    args = ["sweep", "--config", str(spec), "--workdir", str(workdir), "--no-progress"]
    handler = signal.getsignal(signal.SIGTERM)
    assert cli_main(args) == 0
    # The sweep's SIGTERM handler is the sweep's only: a process that called main()
    # (and the pool workers it forks later, data tokenize's) gets its own back.
    assert signal.getsignal(signal.SIGTERM) is handler
    rows = read_csv(workdir / "results.csv")
    assert list(rows) == ["pre_ln-L2", "hc-L2"]
    for name, row in rows.items():
        assert row["status"] == "done"
        result = json.loads((workdir / name / "result.json").read_text())
        assert float(row["final_val_loss"]) == pytest.approx(result["final_val_loss"], rel=1e-5)
        assert 0 < result["final_val_loss"] < 10 and result["steps"] == 4
        assert (workdir / name / "metrics.jsonl").exists()
    capsys.readouterr()
    assert cli_main(args) == 0  # everything finished: skipped
    assert "2 runs: 2 done" in capsys.readouterr().out
    assert cli_main(["report", str(workdir)]) == 0
    assert (workdir / "report.md").exists() and (workdir / "training_curves.png").exists()
