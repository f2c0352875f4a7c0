"""A newcomer's first hour (issue 16): each papercut found, pinned by a test
(those of the launch scripts, which run them: tests/integration/test_newcomer_launchers.py).

A tiny model on a pre-tokenised shard (as in test_train_loop.py) serves the
tests that need a finished run: the one-run report, train --dry-run and the
re-evaluated final train loss.
"""

from __future__ import annotations

import json
import re
import shlex
import time

import numpy as np
import pytest
from paths import REPO
from readme_blocks import parse

from depthbench import config as config_lib
from depthbench import run_report
from depthbench.cli import main as cli_main
from depthbench.cli import sweep as sweep_cli
from depthbench.config import ConfigError
from depthbench.rundir.io import read_jsonl
from depthbench.train import loop
from depthbench.train.metrics import MetricsWriter

STEPS, EVERY = 8, 4


@pytest.fixture(scope="module")
def overrides(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    docs = []
    for _ in range(300):
        start, stride, n = rng.integers(0, 63), rng.integers(1, 8), rng.integers(20, 80)
        docs += [(start + stride * np.arange(n)) % 63 + 1, np.zeros(1, np.int64)]
    np.save(root / "shard.npy", np.concatenate(docs).astype(np.uint16))
    return [
        "model.suite=", "model.d_model=32", "model.d_ff=64", "model.depth=2", "model.n_heads=2",
        "model.vocab_size=64", "model.remat_policy=none",
        "data.corpus=tokens", f"data.paths={root / 'shard.npy'}", "data.eos_id=0",
        "data.val_fraction=0.1", "data.val_windows=8", f"data.cache_dir={root / 'cache'}",
        f"train.steps={STEPS}", "train.batch_size=4", "train.seq_len=16", "train.lr=1e-2",
        "train.log_every=1", f"train.eval_every={EVERY}", f"train.checkpoint_every={EVERY}",
        f"train.layer_stats_every={EVERY}",
    ]


@pytest.fixture(scope="module")
def finished(overrides, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("runs") / "tiny"
    config = config_lib.load(config_lib.base_spec_path(), overrides)
    return workdir, loop.run(config, workdir, progress=False)


def _cli(capsys, *args):
    capsys.readouterr()
    rc = cli_main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------ 1. README workdirs


def test_readme_never_reuses_a_workdir_for_another_config():
    """Finding 1: the override example trained hc/L8 into the L4 demo's directory."""
    seen: dict[str, str] = {}
    for block in parse(REPO / "README.md", REPO):
        for command in block.commands():
            words = shlex.split(command.text, comments=True)
            if "train" not in words or "--workdir" not in words:
                continue
            workdir = words[words.index("--workdir") + 1]
            what = " ".join(w for w in words if w.startswith(("--config", "experiments/")))
            assert seen.setdefault(workdir, what) == what, f"{workdir}: {what}"
    assert len(seen) >= 2


# ------------------------------------------------ 3. re-evaluating a run


def test_re_evaluated_run_keeps_its_final_train_loss(finished, overrides):
    workdir, result = finished
    assert result["final_train_loss"] == read_jsonl(workdir / "metrics.jsonl")[-1]["loss"]
    (workdir / "result.json").unlink()  # what the "already done" message suggests
    again = loop.run(config_lib.load(config_lib.base_spec_path(), overrides), workdir,
                     progress=False)
    assert again["final_train_loss"] == result["final_train_loss"]
    assert again["final_val_loss"] == pytest.approx(result["final_val_loss"], rel=1e-6)
    assert json.loads((workdir / "result.json").read_text())["final_train_loss"] is not None


# ------------------------------------------------ 4. report on one run


def test_report_of_one_run(finished, capsys):
    workdir, result = finished
    rc, out, err = _cli(capsys, "report", str(workdir))
    assert rc == 0, err
    assert f"final val loss    {result['final_val_loss']:.4f}" in out
    text = (workdir / "report.md").read_text()
    assert "## Evaluations" in text and "| 8 |" in text
    for png in ("loss_curves.png", "layer_stats.png"):
        assert (workdir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stats = run_report.layer_stats(workdir)
    moments = [f"{d}_{m}" for d in ("backward", "forward")
               for m in ("magnitude", "mean", "norm", "variance")]
    assert sorted(stats) == [*moments, "state_rms", "update_ratio", "update_rms"]
    assert sorted(stats["state_rms"]) == [4, 8]  # layer_stats_every = 4, 8 steps
    assert len(stats["backward_norm"][8]) == 2 and min(stats["backward_norm"][8]) > 0
    assert "| backward_norm | 8 |" in text
    assert len(stats["state_rms"][8]) == 3 and len(stats["update_rms"][8]) == 2  # L2: z0..z2
    for s, u, ratio in zip(stats["state_rms"][8], stats["update_rms"][8],
                           stats["update_ratio"][8], strict=False):
        assert ratio == pytest.approx(u / s, rel=1e-5)  # the definition, via the events


def test_layer_stats_reader_honours_a_resume_purge(tmp_path):
    w = MetricsWriter(tmp_path, 0)
    w.layer_stats(5, {"state_rms": np.array([1.0, 2.0])})
    w.layer_stats(10, {"state_rms": np.array([3.0, 4.0])})  # logged, then interrupted
    w.close()
    time.sleep(1.1)  # event files are named by the second: the resumed session gets its own
    w = MetricsWriter(tmp_path, 5)  # resumed from the step-5 checkpoint
    w.layer_stats(10, {"state_rms": np.array([7.0, 8.0])})
    w.close()
    assert run_report.layer_stats(tmp_path) == {"state_rms": {5: [1.0, 2.0], 10: [7.0, 8.0]}}


def test_report_on_a_missing_or_empty_directory(tmp_path, capsys):
    rc, out, err = _cli(capsys, "report", str(tmp_path / "nope"))
    assert rc == 2 and err == (f"depthbench: error: report: directory "
                               f"'{tmp_path / 'nope'}' does not exist\n")
    rc, out, err = _cli(capsys, "report", str(tmp_path))
    assert rc == 2 and "neither a sweep (results.csv) nor a run (config.json)" in err
    assert len(err.splitlines()) == 1 and list(tmp_path.iterdir()) == []


# ------------------------------------------------ 5. specs outside experiments/


def test_a_spec_elsewhere_builds_on_a_bundled_one(tmp_path):
    spec = tmp_path / "mine.py"
    spec.write_text("from depthbench.config import sibling\n"
                    "quickstart = sibling(__file__, 'quickstart')\n"
                    "def get_config():\n    c = quickstart.get_config()\n"
                    "    c.model.depth = 10\n    return c\n")
    config = config_lib.load(spec)
    assert (config.name, config.model.depth, config.train.steps) == ("quickstart", 10, 150)
    spec.write_text("from depthbench.config import sibling\nx = sibling(__file__, 'nothing')\n")
    with pytest.raises(ConfigError, match=r"sibling\('nothing'\).*import_spec"):
        config_lib.load(spec)


# ------------------------------------------------ 6. dry runs check the data


def test_sweep_dry_run_flags_missing_data(capsys):
    rc, out, err = _cli(capsys, "sweep", "--config", "experiments/paper_400m.py", "--workdir",
                        "runs/never", "--dry-run")
    assert rc == 2 and "280 runs: 280 pending" in out
    assert err == ("depthbench: error: config.data.paths: empty; give comma-separated files "
                   "or globs\n")
    rc, out, err = _cli(capsys, "sweep", "--config", "experiments/paper_400m.py", "--workdir",
                        "runs/never", "--list")
    assert rc == 2 and out == "" and "config.data.paths: empty" in err
    # Files on other hosts: --list only asks for paths; the dry run checks them here.
    paths = "--config.data.paths=/nowhere/train_*.npy"
    rc, out, _ = _cli(capsys, "sweep", "--config", "experiments/paper_400m.py", "--workdir",
                      "runs/never", "--list", paths)
    assert rc == 0 and len(out.splitlines()) == 280
    rc, _, err = _cli(capsys, "sweep", "--config", "experiments/paper_400m.py", "--workdir",
                      "runs/never", "--dry-run", paths)
    assert rc == 2 and "'/nowhere/train_*.npy' matches no file" in err
    assert not (REPO / "runs" / "never").exists()


# ------------------------------------------------ 8. progress bars count


def test_progress_bars_show_the_documents_processed(tmp_path, capsys):
    rc, out, err = _cli(capsys, "data", "prepare", "--config", "experiments/micro.py", "--json",
                        "--config.data.corpus=text", f"--config.data.paths={REPO}/docs/**/*.md",
                        "--config.data.split_by=paragraph", "--config.model.vocab_size=512",
                        "--config.data.val_fraction=0.1",
                        f"--config.data.cache_dir={tmp_path}")
    assert rc == 0, err
    report = json.loads(out)
    n = report["train_documents"] + report["val_documents"]
    assert n > 50 and report["val_windows_available"] < 64  # fewer than data.val_windows
    assert f"scanning corpus: {n} doc" in err and f"tokenising: {n} doc" in err
    assert "tokenising: 0 doc" not in err.split(f"tokenising: {n} doc")[-1]


# ------------------------------------------------ 9. a space for '='


def test_override_with_a_space_gets_a_hint(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(["train", "--config", "experiments/micro.py", "--workdir", "x",
                  "--config.train.steps", "40"])
    assert exit_.value.code == 2 and capsys.readouterr().err.splitlines() == [
        "depthbench: error: unrecognized arguments: 40; write --config.train.steps=40 "
        "(overrides take '=', not a space)"]


# ------------------------------------------------ 10. docs match the code


def test_families_fit_100_columns_and_json_keeps_descriptions(capsys):
    rc, out, _ = _cli(capsys, "families")
    assert rc == 0 and max(len(line) for line in out.splitlines()) <= 100
    rc, out, _ = _cli(capsys, "families", "--json")
    assert any(len(r["description"]) > 45 for r in json.loads(out))


def test_readme_quickstart_table_is_the_reports_table():
    """The README shows report.md's table: rebuilt from the README's own numbers by
    the report's code, it must come out line for line (columns, bold, best lr)."""
    from depthbench import report as reportlib

    lines = (REPO / "README.md").read_text().splitlines()
    top = next(i for i, ln in enumerate(lines) if ln.startswith("| family | AR "))
    end = next(i for i in range(top, len(lines)) if not lines[i].startswith("|"))
    shown = lines[top:end]
    shapes = [tuple(map(float, re.fullmatch(r"AR ([\d.]+) \(L(\d+)\)", h).groups()))
              for h in (c.strip() for c in shown[0].strip("|").split("|")[1:-3])]
    rows = []
    for line in shown[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        lr = float(cells[-1])
        rows.append(reportlib.FamilyRow("micro", cells[0], tuple(
            reportlib.Cell(int(depth), ar, float(text.strip("*")), lr, None, "ok")
            for (ar, depth), text in zip(shapes, cells[1:-3], strict=True))))
    rebuilt = reportlib.md_table(*reportlib.loss_table(rows), align="l").splitlines()
    assert rebuilt == shown


# ------------------------------------------------ 11. train --dry-run


def test_train_dry_run_shows_the_run_and_trains_nothing(finished, overrides, tmp_path, capsys):
    _, result = finished
    args = [f"--config.{o}" for o in overrides]
    rc, out, err = _cli(capsys, "train", "--config", str(config_lib.base_spec_path()),
                        "--workdir", str(tmp_path / "new"), "--dry-run", "--json", *args)
    assert rc == 0, err
    shown = json.loads(out)
    assert f"({result['params']:,};" in shown["parameters"]  # what the trainer counted
    assert shown["model"].startswith("pre_ln  L 2  d_model 32  d_ff 64  heads 2")
    assert shown["mesh"].startswith("data 1  fsdp 1  tensor 1")
    assert "1 file(s)" in shown["data"] and shown["workdir"].endswith("new: new run")
    assert not (tmp_path / "new").exists()
    rc, _, err = _cli(capsys, "train", "--config", str(config_lib.base_spec_path()), "--workdir",
                      str(tmp_path / "new"), "--dry-run", *args, "--config.data.paths=/no.npy")
    assert rc == 2 and "config.data.paths: file '/no.npy' does not exist" in err


# ------------------------------------------------ the smoke-test knobs


def test_overrides_from_the_environment(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DEPTHBENCH_OVERRIDES", "train.steps=3 --config.model.depth=2")
    rc, out, err = _cli(capsys, "train", "--config", "experiments/micro.py", "--workdir",
                        str(tmp_path / "w"), "--dry-run", "--json")
    assert rc == 0, err
    assert "adds --config.train.steps=3 --config.model.depth=2" in err
    assert json.loads(out)["recipe"].startswith("3 steps") and " L 2 " in json.loads(out)["model"]
    monkeypatch.setenv("DEPTHBENCH_OVERRIDES", "train.steps")
    rc, _, err = _cli(capsys, "train", "--config", "experiments/micro.py", "--workdir", "w",
                      "--dry-run")
    assert rc == 2 and "$DEPTHBENCH_OVERRIDES: 'train.steps' is not section.field=value" in err


def test_max_runs_keeps_finished_runs_and_the_first_unfinished(tmp_path, monkeypatch):
    from depthbench import sweep as sweeplib

    runs = sweeplib.expand(REPO / "experiments" / "quickstart.py").runs
    assert [r.name for r in sweep_cli._at_most(list(runs), tmp_path, 2)] == [
        "pre_ln-L2-lr3e-03", "pre_ln-L4-lr3e-03"]
    (tmp_path / "pre_ln-L2-lr3e-03").mkdir()
    (tmp_path / "pre_ln-L2-lr3e-03" / "result.json").write_text('{"diverged": false}')
    assert [r.name for r in sweep_cli._at_most(list(runs), tmp_path, 2)] == [
        "pre_ln-L2-lr3e-03", "pre_ln-L4-lr3e-03", "pre_ln-L10-lr3e-03"]
    monkeypatch.setenv("DEPTHBENCH_MAX_RUNS", "0")
    with pytest.raises(ConfigError, match=r"\$DEPTHBENCH_MAX_RUNS: expected a positive integer"):
        sweep_cli._max_runs(None)
    assert sweep_cli._max_runs("3") == 3
