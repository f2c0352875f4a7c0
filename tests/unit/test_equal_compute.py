"""Loss at equal compute (unit, in-process): the curve arithmetic with known
answers, and the report's section and results.csv columns on a synthetic sweep
whose curves are chosen so every number can be worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib import image as mpimg

from depthbench import costs, report, shapes
from depthbench import equal_compute as ec
from depthbench import sweep as sweeplib
from depthbench.equal_compute import curves
from depthbench.equal_compute import section as ec_section
from depthbench.model.spec import ModelSpec

# ------------------------------------------------------------ the arithmetic


def test_monotone_fit_pools_adjacent_rises_into_their_mean():
    np.testing.assert_allclose(ec.monotone_fit([3.0, 1.0, 2.0]), [3.0, 1.5, 1.5])
    np.testing.assert_allclose(ec.monotone_fit([1.0, 2.0, 3.0]), [2.0, 2.0, 2.0])
    np.testing.assert_allclose(ec.monotone_fit([5.0, 4.0, 4.5, 3.0, 3.5, 3.4]),
                               [5.0, 4.25, 4.25, 3.3, 3.3, 3.3])
    decreasing = [6.0, 5.0, 4.5, 4.4]
    assert ec.monotone_fit(decreasing).tolist() == decreasing  # its own fit, exactly


def test_moving_mean_shortens_its_window_at_the_ends():
    np.testing.assert_allclose(curves.moving_mean([1.0, 2.0, 3.0, 4.0, 5.0], 1),
                               [1.5, 2.0, 3.0, 4.0, 4.5])
    np.testing.assert_allclose(curves.moving_mean([1.0, 2.0, 6.0], 2), [3.0, 3.0, 3.0])
    assert curves.moving_mean([1.0, 7.0], 0).tolist() == [1.0, 7.0]


def test_tokens_to_reach_interpolates_between_records():
    c = ec.Curve.of([100, 200, 300], [5.0, 4.0, 3.0])
    assert ec.tokens_to_reach(c, 3.5).tokens == pytest.approx(250.0)
    assert ec.tokens_to_reach(c, 4.0).tokens == 200.0
    assert ec.tokens_to_reach(c, 3.0).tokens == 300.0
    assert ec.tokens_to_reach(c, 2.9) == curves.Reach(None, curves.NEVER)
    assert ec.tokens_to_reach(c, 5.5) == curves.Reach(None, curves.BEFORE_FIRST)
    # Records out of order are sorted by tokens first.
    assert ec.tokens_to_reach(ec.Curve.of([300, 100, 200], [3.0, 5.0, 4.0]), 3.5).tokens == 250.0


def test_speedup_of_a_synthetic_pair_with_a_known_interpolation():
    baseline = ec.Curve.of([100, 200, 300], [5.0, 4.0, 3.0], flops_per_token=6.0)
    worse = ec.Curve.of([100, 200], [4.5, 3.5], flops_per_token=8.0)
    s = ec.speedup(worse, baseline)
    # The baseline reaches 3.5 half way from 200 to 300 tokens: 250 / 200.
    assert s.baseline_tokens == pytest.approx(250.0)
    assert s.tokens == pytest.approx(1.25)
    assert s.flops == pytest.approx(250 * 6.0 / (200 * 8.0))
    assert s.reverse_tokens is None and s.note == ""  # it never reaches the baseline's 3.0
    better = ec.Curve.of([100, 200], [4.0, 2.5], flops_per_token=8.0)
    s = ec.speedup(better, baseline)
    assert s.tokens is None and s.note == curves.NEVER
    # It reaches the baseline's final 3.0 two thirds of the way from 100 to 200.
    assert s.reverse_tokens == pytest.approx(300 / (100 + 100 * 2 / 3))
    assert s.reverse_flops == pytest.approx(300 * 6.0 / ((100 + 100 * 2 / 3) * 8.0))


def test_speedup_of_a_run_against_itself_is_one_even_when_noisy():
    rng = np.random.default_rng(0)
    tokens = np.arange(1, 41) * 1024.0
    loss = 3.0 + 4.0 * np.exp(-tokens / 8000) + rng.normal(0, 0.15, tokens.size)
    for smooth in (0, 2):
        c = ec.Curve.of(tokens, loss, flops_per_token=7.5e6, smooth=smooth)
        s = ec.speedup(c, c)
        assert (s.tokens, s.flops, s.reverse_tokens, s.reverse_flops) == (1.0, 1.0, 1.0, 1.0)


def test_equal_budget_is_the_smallest_total_and_the_winner_the_lowest_loss_at_it():
    cheap = ec.Curve.of([100, 200], [4.0, 3.0], flops_per_token=2.0)  # ends at 400 FLOPs
    dear = ec.Curve.of([100, 200], [3.9, 2.8], flops_per_token=4.0)  # 400 FLOPs at 100 tokens
    budget, losses = ec.equal_budget({"cheap": cheap, "dear": dear}, "flops")
    assert budget == 400.0
    assert losses == {"cheap": 3.0, "dear": 3.9}
    assert curves.winner(losses) == "cheap"
    budget, losses = ec.equal_budget({"cheap": cheap, "dear": dear}, "tokens")
    assert budget == 200.0 and curves.winner(losses) == "dear"
    assert ec.loss_at(dear, 600.0, "flops") == pytest.approx(3.35)
    assert ec.loss_at(dear, 300.0, "flops") is None  # before its first record
    uncosted = ec.Curve.of([100], [3.0])
    assert ec.equal_budget({"x": uncosted}, "flops") == (None, {"x": None})


# ------------------------------------------------------ a synthetic sweep

TOKENS_PER_STEP = 2048  # the synthetic rows: 200 steps, 409,600 tokens
# (family, depth) -> validation loss at steps 100 and 200.
VAL = {("pre_ln", 2): (4.0, 3.0), ("hc", 2): (3.8, 3.5),
       ("pre_ln", 4): (4.2, 3.2), ("hc", 4): (3.5, 2.9), ("hc", 10): (3.6, 3.3)}
MICRO_AR = {2: 76.0, 4: 30.0, 10: 8.0}


def _write_sweep(path, val_steps=(100, 200)):
    rows = []
    for (family, depth), (mid, final) in VAL.items():
        name = f"{family}-L{depth}"
        rows.append({"name": name, "family": family, "suite": "micro", "depth": depth,
                     "d_model": 0, "aspect_ratio": MICRO_AR[depth], "lr": 3e-3,
                     "params": 1_200_000, "seq_len": 128, "steps": 200, "tokens": 409_600,
                     "final_val_loss": final, "tokens_per_sec": 5000.0, "mfu": None,
                     "diverged_at_step": None, "wall_seconds": 40.0, "status": "done"})
        (path / name).mkdir()
        with open(path / name / "metrics.jsonl", "w") as f:
            for step in range(10, 201, 10):
                rec = {"step": step, "loss": final + 0.1 + 2 * np.exp(-step / 40),
                       "tokens": step * TOKENS_PER_STEP}
                if step in val_steps:
                    rec["val_loss"] = mid if step == 100 else final
                f.write(json.dumps(rec) + "\n")
    (path / "results.csv").write_text(sweeplib.rows_to_csv(rows))  # the pre-issue-31 columns
    return rows


def _fpt(family, depth):
    spec = ModelSpec.from_shape(shapes.suite("micro").shape(depth), family=family)
    return costs.train_flops_per_token(spec, 128)


def test_report_section_and_results_csv_have_the_known_numbers(tmp_path):
    _write_sweep(tmp_path)
    rep = report.write_report(tmp_path)
    csv_text = (tmp_path / "results.csv").read_text()
    assert csv_text.splitlines()[0].split(",") == list(report.CSV_COLUMNS)
    assert list(report.CSV_COLUMNS[-len(ec.COLUMNS):]) == list(ec.COLUMNS)
    rows = {r["name"]: r for r in report.parse_csv(csv_text)}
    for (family, depth) in VAL:
        row = rows[f"{family}-L{depth}"]
        # FLOPs = the cost model's train FLOPs per token x tokens (6-digit CSV).
        assert row["train_flops"] == pytest.approx(_fpt(family, depth) * 409_600, rel=1e-5)
        assert rep.equal_compute.columns[row["name"]]["train_flops"] == \
            _fpt(family, depth) * 409_600
    # Each pre_ln run against itself.
    for depth in (2, 4):
        assert rows[f"pre_ln-L{depth}"]["speedup_tokens"] == 1.0
        assert rows[f"pre_ln-L{depth}"]["speedup_flops"] == 1.0
    # hc L2 ends at 3.5; pre_ln L2 goes 4.0 -> 3.0 over steps 100 -> 200: 3.5 at step 150.
    hc2 = rows["hc-L2"]
    assert hc2["baseline_tokens_to_loss"] == 150 * TOKENS_PER_STEP
    assert hc2["speedup_tokens"] == pytest.approx(0.75)
    assert hc2["speedup_flops"] == pytest.approx(0.75 * _fpt("pre_ln", 2) / _fpt("hc", 2),
                                                 rel=1e-5)
    assert hc2["reverse_speedup_tokens"] is None and hc2["speedup_note"] == ""
    # hc L4 ends at 2.9, below pre_ln L4's 3.2: pre_ln never reaches it; hc reaches
    # 3.2 half way from step 100 (3.5) to 200 (2.9).
    hc4 = rows["hc-L4"]
    assert hc4["speedup_tokens"] is None and hc4["speedup_note"] == "pre_ln never reaches it"
    assert hc4["reverse_speedup_tokens"] == pytest.approx(200 / 150)
    hc10 = rows["hc-L10"]
    assert hc10["speedup_note"] == "no finished pre_ln run at this shape"
    assert hc10["speedup_tokens"] is None and hc10["fitted_final_loss"] == 3.3
    # Equal FLOPs: the budget is the cheaper shape's total; the other shape's
    # loss is its validation curve at the same FLOPs.
    fpt2, fpt4 = _fpt("pre_ln", 2), _fpt("pre_ln", 4)
    budget = 409_600 * min(fpt2, fpt4)
    assert rows["pre_ln-L2"]["equal_flops_budget"] == pytest.approx(budget, rel=1e-5)
    dear = 4 if fpt4 > fpt2 else 2
    mid, final = VAL["pre_ln", dear]
    expected = np.interp(budget / (fpt4 if dear == 4 else fpt2), [204_800, 409_600],
                         [mid, final])
    assert rows[f"pre_ln-L{dear}"]["loss_at_equal_flops"] == pytest.approx(expected, rel=1e-5)
    md = (tmp_path / "report.md").read_text()
    assert "## Loss at equal compute" in md and "Curves: validation loss" in md
    assert "| hc | 4 | 30.0 | " in md and "never reaches it | - | - | 1.33 / " in md
    assert "### Aspect ratio at equal FLOPs, suite `micro`" in md
    # pre_ln wins at L2 with or without charging FLOPs (3.0 vs >= 3.2).
    assert "| pre_ln | **3.0000** | " in md
    png = tmp_path / ec_section.PLOT
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({ec_section.PLOT})" in md
    assert mpimg.imread(png)[..., :3].std() > 0.05
    as_json = report.summary_json(rep)["equal_compute"]
    assert as_json["curve"] == "validation"
    assert {(f["family"], f["best_depth_at_equal_flops"]) for f in as_json["families"]} == {
        ("pre_ln", 2), ("hc", 4)}


def test_runs_evaluated_once_are_compared_on_their_smoothed_training_curves(tmp_path):
    _write_sweep(tmp_path, val_steps=(200,))
    rep = report.write_report(tmp_path, plots=False)
    assert rep.equal_compute.kind == ec_section.TRAINING
    c = rep.equal_compute.curves["pre_ln-L2"]
    loss = [3.1 + 2 * np.exp(-s / 40) for s in range(10, 201, 10)]
    np.testing.assert_allclose(c.fit, curves.moving_mean(loss, ec_section.TRAINING_SMOOTHING))
    assert rep.equal_compute.columns["pre_ln-L2"]["speedup_tokens"] == 1.0
    md = (tmp_path / "report.md").read_text()
    assert "Curves: training loss" in md and "not drawn (--no-plots)" in md


def test_a_results_csv_written_by_a_report_reads_back(tmp_path):
    _write_sweep(tmp_path)
    report.write_report(tmp_path, plots=False)
    first = (tmp_path / "results.csv").read_text()
    report.write_report(tmp_path, plots=False)  # reads its own columns back, writes the same
    assert (tmp_path / "results.csv").read_text() == first
