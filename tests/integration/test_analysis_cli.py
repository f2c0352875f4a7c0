"""`depthbench analyze` end to end on a tiny run directory; report section; sweep hook."""

import json

import pytest
from analysis_tiny import tiny_config, write_run

from depthbench.analysis import report_section, sweep_hook
from depthbench.analysis.names import METRICS
from depthbench.cli import main
from depthbench.report import md_table as _md_table

PNGS = ("angular_distance.png", "causal_and_swap.png", "logit_lens.png", "depth_weights.png")


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "attnres_block_L3"
    config = tiny_config("attnres_block", 3, **{"model.residual.attnres_block_size": 2})
    write_run(run_dir, config, val_tokens=4000)
    rc = main(["analyze", str(run_dir), "--windows", "4", "--seq-len", "16", "--chunk", "4",
               "--window-chunk", "2", "--jacobian-windows", "1"])
    assert rc == 0
    return run_dir, json.loads((run_dir / "analysis" / "analysis.json").read_text())


@pytest.mark.slow
def test_analysis_json_has_every_metric(analysed, capsys):
    run_dir, r = analysed
    assert set(r) == (set(METRICS) - {"stream_diversity"}) | {"meta"}
    L = 3
    assert len(r["logit_lens"]["kl_to_final"]) == L + 1
    assert len(r["angular_distance"]["adjacent"]) == L
    assert len(r["token_collapse"]["effective_rank"]) == L + 1
    assert len(r["block_jacobian"]["deviation"]) == L
    assert len(r["layer_pruning"]["delta"]) == L and len(r["usefulness"]["loss_ratio"]) == L
    assert len(r["causal_score"]["matrix"]) == L and r["causal_score"]["matrix"][1][0] is None
    assert isinstance(r["depth_weights"]["dead_segment"], int)
    assert len(r["depth_weights"]["weights"]) == 2 * L
    assert 0 <= r["late_layer_interaction"]["skip_fraction"] <= 1
    assert r["meta"]["step"] == 7 and r["meta"]["windows"] == 4
    assert r["logit_lens"]["kl_to_final"][-1] == pytest.approx(0.0, abs=1e-5)
    for name in PNGS:
        assert (run_dir / "analysis" / name).stat().st_size > 1000
    out = run_dir.parent / "cmp.png"
    assert main(["analyze", "--compare", str(run_dir), str(run_dir), "--metric", "logit_lens",
                 "--out", str(out)]) == 0
    assert out.stat().st_size > 1000


@pytest.mark.slow
def test_report_section_lists_analysed_runs(analysed):
    run_dir, r = analysed
    rows = [{"name": run_dir.name, "family": "attnres_block", "depth": 3, "aspect_ratio": 10.67},
            {"name": "not_analysed", "family": "pre_ln", "depth": 3, "aspect_ratio": 10.67}]
    lines = report_section.markdown_lines(run_dir.parent, rows, _md_table)
    assert lines[0] == "## Depth analyses"
    table = [ln for ln in "\n".join(lines).splitlines() if ln.startswith("| attnres_block")]
    assert len(table) == 1
    cells = [c.strip() for c in table[0].strip("|").split("|")]
    assert cells[1] == "3" and cells[5] == f"{r['effective_depth']['value']} / 3"
    assert cells[8] == str(r["depth_weights"]["dead_segment"])
    assert report_section.markdown_lines(run_dir.parent, rows[1:], _md_table) == []
    # A sweep's variant row keeps its label (the analysis records the plain family).
    labelled = [{**rows[0], "family": "attnres_block+variant"}]
    shown = "\n".join(report_section.markdown_lines(run_dir.parent, labelled, _md_table))
    assert "| attnres_block+variant |" in shown


@pytest.mark.slow
def test_sweep_hook(analysed, tmp_path):
    run_dir, _ = analysed
    config = tiny_config("pre_ln", 2, **{"analysis.enabled": True})
    logs = []
    # Already analysed: nothing recomputed.
    assert sweep_hook.after_run(config, run_dir, logs.append) == str(
        run_dir / "analysis" / "analysis.json")
    assert sweep_hook.after_run(tiny_config("pre_ln", 2), tmp_path, logs.append) is None
    # A run without a validation split: the failure is logged, not raised.
    bare = tmp_path / "bare"
    write_run(bare, tiny_config("pre_ln", 2))
    assert sweep_hook.after_run(config, bare, logs.append) is None
    assert "analysis FAILED" in logs[-1] and (bare / "analysis" / "failure.txt").exists()


def test_bad_metric_is_one_line_exit_2(tmp_path, capsys):
    assert main(["analyze", str(tmp_path), "--metrics", "angular_distance,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--metrics: nope" in err[0]
    assert main(["analyze", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err
