"""The report's downstream section: eval results of each shape's best run, per
family and aspect ratio, with a plot; nothing when no run was evaluated."""

from __future__ import annotations

import json

from matplotlib import image as mpimg

from depthbench import report
from depthbench import sweep as sweeplib
from depthbench.formatting import fmt_lr

AR = {2: 76.0, 4: 30.0}


def _row(family, depth, lr, loss):
    return {"name": f"{family}-L{depth}-lr{fmt_lr(lr)}", "family": family,
            "suite": "micro", "depth": depth, "d_model": 0, "aspect_ratio": AR[depth], "lr": lr,
            "params": 1_200_000, "seq_len": 128, "steps": 200, "tokens": 409_600,
            "final_val_loss": loss, "tokens_per_sec": 5000.0, "mfu": None,
            "diverged_at_step": None, "wall_seconds": 40.0, "status": "done"}


def _nll(all_, coding, stem, math_):
    cat = lambda v: {"nll_mean": v, "num_target_tokens": 10}
    return {"suite": "nll-code-stem-math", "aggregate": cat(all_),
            "categories": {"coding": cat(coding), "stem": cat(stem), "math": cat(math_)},
            "tasks": {}}


def _acc(*accs):
    return {"suite": "commonsense", "tasks": {f"t{i}": {"acc,none": a, "acc_stderr,none": 0.1}
                                              for i, a in enumerate(accs)}}


def test_downstream_table_and_plot(tmp_path):
    rows = [_row("pre_ln", 2, 1e-3, 3.5), _row("pre_ln", 2, 3e-3, 3.4),  # best: lr 3e-3
            _row("pre_ln", 4, 3e-3, 3.3), _row("hc", 2, 3e-3, 3.45), _row("hc", 4, 3e-3, 3.2)]
    (tmp_path / "results.csv").write_text(sweeplib.rows_to_csv(rows))
    evals = {"pre_ln-L2-lr3e-03": (_nll(2.5, 2.0, 2.6, 2.9), _acc(0.30, 0.40)),
             "pre_ln-L2-lr1e-03": (_nll(9.9, 9.9, 9.9, 9.9), None),  # not the best lr: unused
             "pre_ln-L4-lr3e-03": (_nll(2.4, 2.1, 2.5, 2.6), _acc(0.50, 0.30)),
             "hc-L4-lr3e-03": (_nll(2.2, 1.9, 2.3, 2.4), None)}
    for name, (nll, acc) in evals.items():
        (tmp_path / name / "eval").mkdir(parents=True)
        (tmp_path / name / "eval" / "nll-code-stem-math.json").write_text(json.dumps(nll))
        if acc:
            (tmp_path / name / "eval" / "commonsense.json").write_text(json.dumps(acc))
    rep = report.write_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "## Downstream evaluation" in md
    assert "| pre_ln | all | 2.5000 | **2.4000** |" in md
    assert "| pre_ln | coding | **2.0000** | 2.1000 |" in md
    assert "| hc | all | - | 2.2000 |" in md  # hc L2 was not evaluated
    assert "| pre_ln | mean acc | 0.3500 | **0.4000** |" in md
    assert "9.9000" not in md
    assert md.index("## Downstream evaluation") < md.index("## All runs")
    png = tmp_path / "downstream_vs_aspect.png"
    assert rep.files["downstream"] == str(png)
    img = mpimg.imread(png)
    assert img.shape[1] > 1.5 * img.shape[0]  # two panels side by side


def test_no_section_without_evaluated_runs(tmp_path):
    (tmp_path / "results.csv").write_text(sweeplib.rows_to_csv([_row("pre_ln", 2, 1e-3, 3.5)]))
    report.write_report(tmp_path, plots=False)
    assert "Downstream" not in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "downstream_vs_aspect.png").exists()


def test_fine_tuned_scores_beside_the_zero_shot_ones(tmp_path):
    rows = [_row("pre_ln", 2, 3e-3, 3.4), _row("pre_ln", 4, 3e-3, 3.3), _row("hc", 4, 3e-3, 3.2)]
    (tmp_path / "results.csv").write_text(sweeplib.rows_to_csv(rows))
    scores = {("pre_ln-L2-lr3e-03", ""): 0.30, ("pre_ln-L2-lr3e-03", "sft"): 0.45,
              ("pre_ln-L4-lr3e-03", ""): 0.35, ("hc-L4-lr3e-03", ""): 0.40,
              ("hc-L4-lr3e-03", "sft"): 0.55}
    for (name, within), acc in scores.items():
        (tmp_path / name / within / "eval").mkdir(parents=True)
        (tmp_path / name / within / "eval" / "commonsense.json").write_text(
            json.dumps(_acc(acc)))
    for name, before, after in (("pre_ln-L2-lr3e-03", 3.1, 1.2), ("hc-L4-lr3e-03", 2.9, 1.1)):
        (tmp_path / name / "sft" / "result.json").write_text(json.dumps(
            {"status": "finished", "final_val_loss": after,
             "finetune": {"initial_val_loss": before}}))
    report.write_report(tmp_path, plots=False)
    md = (tmp_path / "report.md").read_text()
    assert "| family | metric | stage | 76 (L2) | 30 (L4) |" in md
    assert "| pre_ln | mean acc | zero-shot | 0.3000 | **0.3500** |" in md
    assert "| pre_ln | mean acc | fine-tuned | 0.4500 | - |" in md
    assert "| hc | mean acc | zero-shot | - | 0.4000 |" in md
    assert "| hc | mean acc | fine-tuned | - | 0.5500 |" in md
    assert "| pre_ln | 3.1000 → 1.2000 | - |" in md and "| hc | - | 2.9000 → 1.1000 |" in md
    assert md.index("## Fine-tuning") < md.index("## Downstream evaluation")
