"""A sweep that fine-tunes each finished run and evaluates it, in-process: a tiny
model trained on the real micro corpus, then (the spec now setting
finetune.records) fine-tuned into RUN_DIR/sft/ and evaluated before and
after, nothing redone when the sweep runs again, and the report setting the
zero-shot and fine-tuned scores side by side."""

from __future__ import annotations

import json

import pytest
from eval_tiny import write_records
from sweep_spec import tiny_config

from depthbench.cli import main as cli_main
from depthbench.run import open_run

SPEC = """
from depthbench.config import base_config

def get_config():
""" + tiny_config(checkpoint_every=4, layer_stats_every=0) + """\
    c.eval.suites = "nll-code-stem-math"
    c.eval.data_dir = {eval_dir!r}
    f = c.finetune
    f.records, f.spec = {records!r}, {recipe!r}
    f.epochs, f.max_seq_len, f.val_fraction = 2.0, 96, 0.34
    return c

def get_sweep():
    return [{{"model.family": "pre_ln", "model.depth": 2}}]
"""
# The fine-tuning recipe: the original's, shrunk to the test's size.
RECIPE = """
from depthbench.config import import_spec

def get_config():
    c = import_spec("sft").get_config()
    c.model.compute_dtype = "float32"
    c.train.batch_size, c.train.seq_len = 2, 96
    return c
"""
RECORDS = [{"instruction": "Name a colour.", "input": "", "output": "Blue."},
           {"instruction": "Name an animal.", "input": "", "output": "A cat."},
           {"instruction": "Name a number.", "input": "", "output": "Seven."}]


@pytest.mark.slow
def test_a_sweep_fine_tunes_and_evaluates_each_finished_run(tmp_path, capsys):
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (tmp_path / "recipe.py").write_text(RECIPE)
    spec = tmp_path / "sweep.py"
    spec.write_text(SPEC.format(eval_dir=str(write_records(tmp_path / "eval")),
                                records=str(tmp_path / "records.jsonl"),
                                recipe=str(tmp_path / "recipe.py")))
    workdir = tmp_path / "w"
    args = ["sweep", "--config", str(spec), "--workdir", str(workdir), "--no-progress"]
    assert cli_main([*args, "--config.finetune.records="]) == 0  # trained, not fine-tuned
    run = workdir / "pre_ln-L2"
    assert (run / "result.json").exists() and not (run / "sft").exists()
    assert cli_main(args) == 0  # the spec now asks: the finished run is fine-tuned
    result = json.loads((run / "sft" / "result.json").read_text())
    assert result["status"] == "finished" and result["steps"] == 2  # 2 records x 2 epochs / 2
    assert result["finetune"]["parent"] == str(run.resolve())
    # The parent's model, as every reader opens it (its shape completed).
    assert open_run(run / "sft").config.model == open_run(run).config.model
    zero = json.loads((run / "eval" / "nll-code-stem-math.json").read_text())
    tuned = json.loads((run / "sft" / "eval" / "nll-code-stem-math.json").read_text())
    assert zero["aggregate"]["nll_mean"] != tuned["aggregate"]["nll_mean"]
    stamp = (run / "sft" / "result.json").stat().st_mtime_ns
    capsys.readouterr()
    assert cli_main(args) == 0  # finished and evaluated: nothing redone
    assert (run / "sft" / "result.json").stat().st_mtime_ns == stamp
    assert "fine-tuned" not in capsys.readouterr().err
    assert cli_main(["report", str(workdir), "--no-plots"]) == 0
    md = (workdir / "report.md").read_text()
    assert "| pre_ln | all | zero-shot |" in md and "| pre_ln | all | fine-tuned |" in md
    assert "## Fine-tuning" in md and " → " in md
