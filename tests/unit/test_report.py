"""Report tables from a synthetic results set (known values in, known table out),
the published reference data, and the plot files."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib import colormaps
from matplotlib import image as mpimg
from paths import REPO

from depthbench import plots, reference, report, shapes
from depthbench import sweep as sweeplib
from depthbench.cli import main as cli_main
from depthbench.formatting import fmt_lr

MICRO_AR = {2: 76.0, 4: 30.0, 10: 8.0}
# (family, depth, lr) -> final val loss; None = diverged; "pending" = not run yet.
SYNTHETIC = {
    ("pre_ln", 2, 1e-3): 3.50, ("pre_ln", 2, 3e-3): 3.40,
    ("pre_ln", 4, 1e-3): 3.30, ("pre_ln", 4, 3e-3): 3.35,
    ("pre_ln", 10, 1e-3): 3.60, ("pre_ln", 10, 3e-3): None,
    ("hc", 2, 1e-3): 3.45, ("hc", 2, 3e-3): 3.38,
    ("hc", 4, 1e-3): 3.25, ("hc", 4, 3e-3): 3.20,
    ("hc", 10, 1e-3): None, ("hc", 10, 3e-3): None,
    ("mhc", 2, 1e-3): "pending",
}


def _row(family, depth, lr, loss, suite="micro", ar=None, name=None):
    status = "pending" if loss == "pending" else ("diverged" if loss is None else "done")
    return {
        "name": name or f"{family}-L{depth}-lr{fmt_lr(lr)}", "family": family,
        "suite": suite, "depth": depth, "d_model": 0, "aspect_ratio": ar or MICRO_AR[depth],
        "lr": lr, "params": 1_200_000, "seq_len": 128, "steps": 200, "tokens": 409_600,
        "final_val_loss": loss if status == "done" else None, "tokens_per_sec": 5000.0,
        "mfu": None, "diverged_at_step": 17 if status == "diverged" else None,
        "wall_seconds": 40.0, "status": status,
    }


@pytest.fixture()
def synthetic_dir(tmp_path) -> Path:
    rows = [_row(f, d, lr, loss) for (f, d, lr), loss in SYNTHETIC.items()]
    (tmp_path / "results.csv").write_text(sweeplib.rows_to_csv(rows))
    # Training curves of the best runs (what the trainer's metrics.jsonl holds).
    for name, final in (("pre_ln-L4-lr1e-03", 3.30), ("hc-L4-lr3e-03", 3.20),
                        ("pre_ln-L2-lr3e-03", 3.40)):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / "metrics.jsonl", "w") as f:
            for step in range(10, 201, 10):
                rec = {"step": step, "loss": final + 4 * np.exp(-step / 40), "lr": 3e-3}
                if step == 200:
                    rec["val_loss"] = final
                f.write(json.dumps(rec) + "\n")
            f.write('{"step": 210, "loss": ')  # a torn last line is ignored
    return tmp_path


def test_summary_best_lr_per_shape_and_best_aspect_ratio():
    rows = [_row(f, d, lr, loss) for (f, d, lr), loss in SYNTHETIC.items()]
    summary = report.summarize(rows)
    assert list(summary) == ["micro"]
    by_family = {fr.family: fr for fr in summary["micro"]}
    assert list(by_family) == ["pre_ln", "hc", "mhc"]
    pre = by_family["pre_ln"]
    assert [(c.depth, c.loss, c.lr) for c in pre.cells] == [
        (2, 3.40, 3e-3), (4, 3.30, 1e-3), (10, 3.60, 1e-3)]
    assert (pre.best.depth, pre.best.aspect_ratio, pre.best.loss) == (4, 30.0, 3.30)
    hc = by_family["hc"]
    assert [c.state for c in hc.cells] == ["ok", "ok", "diverged"]
    assert (hc.best.depth, hc.best.lr) == (4, 3e-3)
    assert [c.state for c in by_family["mhc"].cells] == ["pending"] * 3
    assert by_family["mhc"].best is None


def test_markdown_tables_are_exact(synthetic_dir):
    rep = report.write_report(synthetic_dir)
    md = (synthetic_dir / "report.md").read_text()
    expected_loss = "\n".join([
        "| family | AR 76.0 (L2) | AR 30.0 (L4) | AR 8.0 (L10) | best AR | best loss | best lr |",
        "| :--- | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| pre_ln | 3.4000 | **3.3000** | 3.6000 | 30.0 | 3.3000 | 1e-03 |",
        "| hc | 3.3800 | **3.2000** | diverged | 30.0 | 3.2000 | 3e-03 |",
        "| mhc | - | - | - | - | - | - |",
    ])
    expected_lr = "\n".join([
        "| family | AR 76.0 (L2) | AR 30.0 (L4) | AR 8.0 (L10) |",
        "| :--- | ---: | ---: | ---: |",
        "| pre_ln | 3e-03 | 1e-03 | 1e-03 |",
        "| hc | 3e-03 | 3e-03 | diverged |",
        "| mhc | - | - | - |",
    ])
    assert expected_loss in md
    assert expected_lr in md
    assert "13 runs: 9 done, 3 diverged, 1 pending." in md
    assert "| hc-L10-lr1e-03 | hc | 10 | 8.0 | 1e-03 | 1.20M | - | 5,000 | - | diverged @17 |" in md
    # results.csv is rewritten with the same rows.
    again = report.parse_csv((synthetic_dir / "results.csv").read_text())
    assert [(r["name"], r["final_val_loss"], r["status"]) for r in again] == [
        (r["name"], r["final_val_loss"], r["status"]) for r in rep.rows]
    assert again[0]["final_val_loss"] == 3.5 and again[0]["depth"] == 2


def _png(path: Path) -> np.ndarray:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return mpimg.imread(path)[..., :3]


def _pixels_of(img: np.ndarray, rgb, tol=0.04) -> int:
    return int(np.sum(np.all(np.abs(img - np.asarray(rgb)[:3]) < tol, axis=-1)))


def test_plots_exist_and_show_the_data(synthetic_dir):
    report.write_report(synthetic_dir)
    tab10 = colormaps["tab10"]
    loss = _png(synthetic_dir / "loss_vs_aspect.png")
    assert loss.shape[0] > 300 and loss.shape[1] > 500
    # A line per family with data, in its colour (pre_ln first, hc second).
    assert _pixels_of(loss, tab10(0)) > 200 and _pixels_of(loss, tab10(1)) > 200
    curves = _png(synthetic_dir / "training_curves.png")
    assert curves.std() > 0.05 and len(np.unique(curves.reshape(-1, 3), axis=0)) > 50
    costs = _png(synthetic_dir / "costs_vs_aspect.png")
    assert _pixels_of(costs, tab10(0)) > 100
    md = (synthetic_dir / "report.md").read_text()
    for name in ("loss_vs_aspect.png", "training_curves.png", "costs_vs_aspect.png"):
        assert f"]({name})" in md


def test_costs_table_from_the_suite(synthetic_dir):
    rep = report.write_report(synthetic_dir, plots=False)
    rows = report.cost_rows(synthetic_dir, rep.rows)
    pre = {r["depth"]: r for r in rows if r["family"] == "pre_ln"}
    s = shapes.suite("micro").shape(10)
    # KV cache: 2 * L * T * n_kv * head_dim * 2 bytes at the run's T = 128.
    assert pre[10]["kv_cache_bytes"] == 2 * 10 * 128 * s.n_kv_heads * s.head_dim * 2
    assert pre[10]["params"] == s.total_params  # pre_ln adds nothing to the backbone


PAPER = {("pre_ln", 16): 2.800, ("pre_ln", 32): 2.790, ("hc", 16): 2.740, ("hc", 70): 2.690}


def test_paper_suite_is_compared_with_the_published_losses(tmp_path):
    s = shapes.suite("paper-400m")
    rows = [_row(f, d, 2e-3, loss, suite="paper-400m", ar=s.shape(d).aspect_ratio)
            for (f, d), loss in PAPER.items()]
    (tmp_path / "results.csv").write_text(sweeplib.rows_to_csv(rows))
    report.write_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "### Measured / published validation loss, suite `paper-400m`" in md
    # L16, L20, L24, L28, L32, L42, L70 columns; measured / published (delta).
    assert ("| pre_ln | 2.800 / 2.759 (+0.041) | - / 2.759 | - / 2.765 | - / 2.774 | "
            "2.790 / 2.782 (+0.008) | - | - | 28.0 | 76.0 |") in md
    assert ("| hc | 2.740 / 2.729 (+0.011) | - / 2.716 | - / 2.702 | - / 2.714 | - / 2.700 | "
            "- / 2.691 | 2.690 / 2.682 (+0.008) | 9.1 | 9.1 |") in md
    img = _png(tmp_path / "loss_vs_aspect.png")
    # The ten published designs are drawn (dashed, lighter: alpha over white) beside the
    # two measured ones: every family colour appears in its reference shade.
    tab10 = np.array([colormaps["tab10"](k)[:3] for k in range(10)])
    light = plots.REFERENCE_ALPHA * tab10 + (1 - plots.REFERENCE_ALPHA)
    assert sum(_pixels_of(img, c, tol=0.06) > 20 for c in light) == 10
    assert _pixels_of(img, tab10[0]) > 200 and _pixels_of(img, tab10[1]) > 200


def test_reference_data_matches_the_spec():
    spec = REPO / "docs" / "spec" / "shapes_and_recipe.md"
    text = spec.read_text().split("## Published reference numbers")[1]
    table = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.fullmatch(r"\d\.\d{3}", cells[1]):
            table[cells[0]] = dict(zip((16, 20, 24, 28, 32), map(float, cells[1:]), strict=True))
    num = r"(\d\.\d+)"
    deep = re.search(rf"At L42 and L70: attnres_full {num} / {num}, hc {num} / {num}", text)
    table["attnres_full"].update({42: float(deep[1]), 70: float(deep[2])})
    table["hc"].update({42: float(deep[3]), 70: float(deep[4])})
    assert reference.losses("paper-400m") == table
    assert len(table) == 10
    assert reference.losses("paper-1p6b") == {} and reference.points("micro") == []
    pts = {(p.family, p.depth): p for p in reference.points("paper-400m")}
    assert pts[("pre_ln", 16)].aspect_ratio == 76.0 and pts[("hc", 70)].val_loss == 2.682
    assert reference.best_depth("paper-400m", "hc") == 70


def test_report_refreshes_rows_finished_after_results_csv(tmp_path):
    spec = tmp_path / "spec.py"
    spec.write_text("from depthbench.config import base_config as get_config\n"
                    "def get_sweep():\n"
                    "    return [{'model.depth': d} for d in (2, 4)]\n")
    s = sweeplib.expand(spec)

    def runner(config, workdir, *, progress=True):
        result = {"final_val_loss": 3.0 + config.model.depth / 100, "diverged": False}
        (Path(workdir) / "result.json").write_text(json.dumps(result))
        return result

    sweeplib.run_sweep(s, tmp_path / "w", runner=runner, progress=False)
    stale = (tmp_path / "w" / "results.csv").read_text().replace(",done", ",pending")
    (tmp_path / "w" / "results.csv").write_text(stale)
    rows = report.load_rows(tmp_path / "w")
    assert [(r["name"], r["status"], r["final_val_loss"]) for r in rows] == [
        ("L2", "done", 3.02), ("L4", "done", 3.04)]


def test_report_cli(synthetic_dir, tmp_path, capsys):
    assert cli_main(["report", str(synthetic_dir)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^pre_ln +3\.4000 +3\.3000 \* +3\.6000 +30\.0 +3\.3000 +1e-03$", out, re.M)
    assert re.search(r"^hc +3\.3800 +3\.2000 \* +diverged +30\.0 +3\.2000 +3e-03$", out, re.M)
    assert cli_main(["report", str(synthetic_dir), "--json", "--no-plots"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]["micro"]
    assert summary["hc"]["best"]["depth"] == 4 and summary["hc"]["best"]["lr"] == 3e-3
    assert cli_main(["report", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err == (f"depthbench: error: report: directory "
                                       f"'{tmp_path / 'nothing'}' does not exist\n")


# ------------------------------------------------------------ damaged runs

GARBAGE = {  # file -> what a damage leaves in it
    "result.json": "{\"final_val_loss\": 3.3, \"steps\"",
    "config.json": "\x00\x01 not json",
    "sweep_run.json": "[1, 2, 3]\n",
    "metrics.jsonl": None,  # a line in the middle overwritten, see below
}


def _damage(run_dir: Path, name: str) -> str:
    """Damage ``name`` in ``run_dir``; return what the report must say about it."""
    if name == "metrics.jsonl":
        lines = (run_dir / name).read_text().splitlines(keepends=True)
        lines[3] = "#### not a row ####\n"
        (run_dir / name).write_text("".join(lines))
        return "metrics.jsonl line 4 is not JSON"
    (run_dir / name).write_text(GARBAGE[name])
    return {"result.json": "result.json is not JSON", "config.json": "config.json is not JSON",
            "sweep_run.json": "sweep_run.json holds a JSON list, not an object"}[name]


@pytest.mark.parametrize("name", list(GARBAGE))
def test_report_marks_a_run_with_a_damaged_record(synthetic_dir, capsys, name):
    """The best pre_ln run at L4 (3.30 in results.csv) is damaged: the report names
    the run and the file, marks its row, and shows the next best run of L4 instead."""
    damaged = "pre_ln-L4-lr1e-03"
    said = _damage(synthetic_dir / damaged, name)
    csv_before = (synthetic_dir / "results.csv").read_text()
    capsys.readouterr()
    assert cli_main(["report", str(synthetic_dir), "--no-plots"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"depthbench: warning: run '{damaged}': {said}")
    assert err[0].endswith("; its row is marked damaged")
    md = (synthetic_dir / "report.md").read_text()
    # The loss table: L4 is pre_ln's other run (3.35, still pre_ln's best shape).
    assert "| pre_ln | 3.4000 | **3.3500** | 3.6000 | 30.0 | 3.3500 | 3e-03 |" in md
    assert "3.3000" not in md.split("## All runs")[0]
    assert f"| {damaged} | pre_ln | 4 | 30.0 | 1e-03 | - | - | - | - | damaged (see below) |" in md
    assert f"- `{damaged}`: {said}" in md.split("## Damaged runs")[1]
    assert "12 runs" not in md and "13 runs: 8 done, 3 diverged, 1 pending, 1 damaged." in md
    # Its values are kept in the sweep's columns; the report's equal-compute
    # columns (appended) show nothing of it.
    after = list(csv.reader(io.StringIO((synthetic_dir / "results.csv").read_text())))
    n = len(sweeplib.RESULT_COLUMNS)
    assert [r[:n] for r in after] == list(csv.reader(io.StringIO(csv_before)))
    assert next(r for r in after if r[0] == damaged)[n:] == [""] * (len(after[0]) - n)


def test_report_names_a_damaged_manifest(synthetic_dir, capsys):
    (synthetic_dir / "sweep.json").write_text("{ torn")
    assert cli_main(["report", str(synthetic_dir), "--no-plots"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"depthbench: warning: {synthetic_dir / 'sweep.json'}: is not JSON "
                   "(Expecting property name enclosed in double quotes: line 1 column 3) "
                   "(the sweep's manifest; `depthbench sweep` writes it again)"]


def _one_run(tmp_path: Path) -> Path:
    """A finished run directory as the trainer leaves it (no checkpoints)."""
    run = tmp_path / "run"
    run.mkdir()
    config = {"model": {"family": "hc"}, "train": {"steps": 20},
              "resolved": {"shape": {"depth": 4, "d_model": 64}}}
    (run / "config.json").write_text(json.dumps(config))
    rows = [{"step": s, "loss": 4.0 - s / 10, "lr": 1e-3, "grad_norm": 1.0} for s in range(1, 21)]
    rows[-1]["val_loss"] = 2.1
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_run_report_with_a_garbage_result_is_not_called_unfinished(tmp_path, capsys):
    run = _one_run(tmp_path)
    (run / "result.json").write_text("garbage")
    assert cli_main(["report", str(run), "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (f"depthbench: warning: {run / 'result.json'}: is not JSON "
                            "(Expecting value: line 1 column 1)\n")
    assert "not finished" not in captured.out
    assert captured.out.startswith("outcome unknown: result.json is not JSON")
    text = (run / "report.md").read_text()
    assert "## Damaged files" in text and "- `result.json` is not JSON" in text


def test_run_report_draws_a_damaged_log_up_to_the_damage(tmp_path, capsys):
    run = _one_run(tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[10] = '{"step": 11, "loss": 3.\n'  # a whole line that does not parse: not a torn tail
    (run / "metrics.jsonl").write_text("".join(lines))
    assert cli_main(["report", str(run), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"depthbench: warning: {run / 'metrics.jsonl'}: line 11 is not JSON")
    text = (run / "report.md").read_text()
    assert "not finished: step 10 of 20 logged" in text  # the rows before the damage
    assert "Logs are shown up to their damaged line." in text
    assert "- `metrics.jsonl` line 11 is not JSON" in text
