"""Sweep expansion, naming, sharding, locks, skip/resume/diverged handling.

Most tests use a fake runner (writes result.json and metrics.jsonl like the
trainer); one slow test runs two tiny real runs on the micro corpus.  Two
sweeping processes: tests/integration/test_sweep_processes.py.
"""

from __future__ import annotations

import copy
import json
import math
import os
import socket
import time
from pathlib import Path

import pytest
from paths import FIXTURES
from sweep_spec import NAMES, SPEC, read_csv

from depthbench import run_identity as identity
from depthbench import sweep as sweeplib
from depthbench.cli import main as cli_main
from depthbench.config import ConfigError, apply_overrides, base_config
from depthbench.formatting import fmt_lr, run_name
from depthbench.model.residual.protocol import registry
from depthbench.rundir.lock import RunLock
from depthbench.rundir.names import LOCK_FILE, RUN_RECORD


def fake_loss(config) -> float:
    """A known loss per run: best at depth 4 and lr 2.5e-3, hc 0.05 below pre_ln."""
    m, t = config.model, config.train
    return (3.0 + 0.1 * abs(math.log(m.depth / 4)) + 0.05 * abs(math.log(t.lr / 2.5e-3))
            - (0.05 if m.family == "hc" else 0.0))


class FakeRunner:
    """Writes what the trainer writes; records calls; can fail, diverge or stop."""

    def __init__(self, fail=(), diverge=(), interrupt=(), preempt=()):
        self.calls: list[str] = []
        self.fail, self.diverge = set(fail), set(diverge)
        self.interrupt, self.preempt = set(interrupt), set(preempt)

    def __call__(self, config, workdir, *, progress=True):
        name = Path(workdir).name
        self.calls.append(name)
        ckpt = Path(workdir) / "ckpt"
        start = int(ckpt.read_text()) if ckpt.exists() else 0
        if name in self.interrupt:
            self.interrupt.discard(name)
            ckpt.write_text(str(config.train.steps // 2))
            raise KeyboardInterrupt
        if name in self.preempt:
            self.preempt.discard(name)
            ckpt.write_text(str(config.train.steps // 2))
            return {"status": "preempted", "step": config.train.steps // 2}
        if name in self.fail:
            self.fail.discard(name)
            raise RuntimeError("out of memory (fake)")
        diverged = name in self.diverge
        loss = fake_loss(config)
        with open(Path(workdir) / "metrics.jsonl", "w") as f:
            for step in range(0, config.train.steps + 1, 5):
                f.write(json.dumps({"step": step, "loss": loss + math.exp(-step / 5)}) + "\n")
        result = {"family": config.model.family, "depth": config.model.depth, "params": 1234,
                  "steps": config.train.steps, "tokens": 99, "resumed_from": start,
                  "final_val_loss": None if diverged else loss, "tokens_per_sec": 1000.0,
                  "mfu": None, "diverged": diverged, "diverged_at_step": 7 if diverged else None,
                  "wall_seconds": 0.5, "status": "diverged" if diverged else "finished"}
        (Path(workdir) / "result.json").write_text(json.dumps(result))
        return result


@pytest.fixture(scope="module")
def sweep(spec_file) -> sweeplib.Sweep:
    return sweeplib.expand(spec_file)


# ---------------------------------------------------------------- naming


def test_run_names_are_stable_and_safe():
    assert run_name({"model.family": "hc", "model.depth": 8, "train.lr": 3e-3}) == \
        "hc-L8-lr3e-03"
    # Order of keys in the dict does not matter; lr keeps every digit it needs.
    assert run_name({"train.lr": 2.5e-3, "model.depth": 4, "model.family": "mhc"}) == \
        "mhc-L4-lr2.5e-03"
    assert run_name({"model.family": "hc", "model.suite": "paper-400m",
                              "model.depth": 16}) == "hc-400m-L16"
    assert run_name({"model.family": "hc", "model.residual.hc_n": 2,
                              "model.residual.readout": "sum_then_norm",
                              "model.residual.hc_tanh": False}) == \
        "hc-hc_n2-hc_tanh-off-readout-sum_then_norm"
    assert run_name({"name": "my run/1"}) == "my_run_1"
    assert fmt_lr(5e-4) == "5e-04" and fmt_lr(1.25e-3) == "1.25e-03"


# ------------------------------------------------------------- expansion


def test_expand_counts_names_and_overrides(sweep):
    assert [r.name for r in sweep.runs] == NAMES
    assert [r.index for r in sweep.runs] == list(range(8))
    for run in sweep.runs:
        family, depth, lr = run.name.split("-", 2)
        assert run.config.model.family == family
        assert run.config.model.depth == int(depth[1:])
        assert run.config.train.lr == float(lr[2:])
        assert run.config.train.steps == 20  # the spec's shared value
    # micro suite: L2 -> d 152 (aspect 76), L4 -> d 120 (aspect 30)
    assert {(r.shape.depth, r.shape.d_model) for r in sweep.runs} == {(2, 152), (4, 120)}


def test_cli_overrides_apply_to_every_run_but_not_to_swept_fields(spec_file):
    s = sweeplib.expand(spec_file, ["--config.train.steps=7"])
    assert {r.config.train.steps for r in s.runs} == {7}
    with pytest.raises(ConfigError, match=r"--config.train.lr: the sweep sets it per run"):
        sweeplib.expand(spec_file, ["--config.train.lr=1e-2"])


def test_a_family_field_from_the_command_line_goes_to_the_runs_whose_family_has_it(spec_file):
    """The base config's family (pre_ln) has no ``hc_tanh``: the hc runs take it,
    the pre_ln runs do not; a field no run's family has is refused."""
    s = sweeplib.expand(spec_file, ["--config.model.residual.hc_tanh=false"])
    fields = {r.config.model.family: r.config.model.residual.to_dict() for r in s.runs}
    assert fields["pre_ln"] == {} and fields["hc"]["hc_tanh"] is False
    with pytest.raises(ConfigError, match=r"--config.model.residual.moda_kv_heads: no run's "
                                          r"family has that field \(the sweep's families: "
                                          r"hc, pre_ln\)"):
        sweeplib.expand(spec_file, ["--config.model.residual.moda_kv_heads=2"])


def test_bad_sweeps_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(SPEC.replace("(2, 4)", "(2, 5)"))
    with pytest.raises(ConfigError, match=r"sweep run 2 \(pre_ln-L5-lr1e-03\): "
                                          r"config.model.depth: suite 'micro' has no depth 5"):
        sweeplib.expand(bad)
    dup = tmp_path / "dup.py"
    dup.write_text(SPEC.replace("(1e-3, 2.5e-3)", "(1e-3, 1e-3)"))
    with pytest.raises(ConfigError, match="runs 0 and 1 have the same name 'pre_ln-L2-lr1e-03'"):
        sweeplib.expand(dup)
    listed = tmp_path / "listed.py"
    listed.write_text("from depthbench.config import base_config as get_config\n"
                      "def get_sweep():\n    return [['model.depth', 2]]\n")
    with pytest.raises(ConfigError, match=r"entry 0 must be a dict \{'section.field': value\}"):
        sweeplib.expand(listed)
    single = tmp_path / "single.py"
    single.write_text("from depthbench.config import base_config as get_config\n")
    with pytest.raises(ConfigError, match="has no get_sweep"):
        sweeplib.expand(single)


def test_shards_partition_the_runs(sweep):
    names = [r.name for r in sweep.runs]
    for n in (1, 2, 3, 5, 8, 11):
        shards = [[r.name for r in sweep.select(shard=(i, n))] for i in range(n)]
        assert sorted(sum(shards, [])) == sorted(names)  # every run exactly once
        for i, shard in enumerate(shards):
            assert shard == names[i::n]  # every n-th run
    assert sweeplib.parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "1", "-1/2", "a/b", "0/0"):
        with pytest.raises(ConfigError, match="--shard: expected i/N"):
            sweeplib.parse_shard(bad)


def test_select_by_name_pattern_and_index(sweep):
    assert [r.name for r in sweep.select(names=["hc-L4-*"])] == ["hc-L4-lr1e-03",
                                                                 "hc-L4-lr2.5e-03"]
    assert [r.name for r in sweep.select(names=["hc-L4-*"], shard=(1, 2))] == ["hc-L4-lr2.5e-03"]
    assert [r.index for r in sweep.select(indices=[0, 5])] == [0, 5]
    with pytest.raises(ConfigError, match="--run: no run of the sweep is named 'moda-L4'"):
        sweep.select(names=["moda-L4"])
    with pytest.raises(ConfigError, match="--only: index 8 is out of range"):
        sweep.select(indices=[8])


# ----------------------------------------------------------- run handling


def test_sweep_trains_then_skips_finished_runs(sweep, tmp_path):
    runner = FakeRunner()
    out = sweeplib.run_sweep(sweep, tmp_path, runner=runner, progress=False)
    assert runner.calls == NAMES and out.ok and out.trained == NAMES
    rows = read_csv(tmp_path / "results.csv")
    assert list(rows) == NAMES
    for run in sweep.runs:
        row = rows[run.name]
        assert row["status"] == "done"
        assert float(row["final_val_loss"]) == pytest.approx(fake_loss(run.config), abs=1e-6)
        assert row["family"] == run.config.model.family
        assert int(row["depth"]) == run.config.model.depth
        assert float(row["lr"]) == run.config.train.lr
        assert float(row["aspect_ratio"]) == {2: 76.0, 4: 30.0}[run.config.model.depth]
        assert int(row["params"]) == 1234 and float(row["tokens_per_sec"]) == 1000.0
    assert set(rows["pre_ln-L2-lr1e-03"]) >= {"family", "depth", "d_model", "aspect_ratio", "lr",
                                              "params", "final_val_loss", "tokens_per_sec",
                                              "mfu", "status"}
    manifest = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["name"] for r in manifest["runs"]] == NAMES
    # Again: nothing is trained, nothing changes.
    again = FakeRunner()
    out = sweeplib.run_sweep(sweep, tmp_path, runner=again, progress=False)
    assert again.calls == [] and out.skipped == NAMES
    assert read_csv(tmp_path / "results.csv") == rows


def test_diverged_recorded_failed_retried(sweep, tmp_path):
    runner = FakeRunner(fail=["pre_ln-L4-lr1e-03"], diverge=["hc-L2-lr2.5e-03"])
    out = sweeplib.run_sweep(sweep, tmp_path, runner=runner, progress=False)
    assert runner.calls == NAMES  # the sweep went on after both
    assert out.failed == ["pre_ln-L4-lr1e-03"] and out.diverged == ["hc-L2-lr2.5e-03"]
    assert not out.ok
    rows = read_csv(tmp_path / "results.csv")
    assert rows["pre_ln-L4-lr1e-03"]["status"] == "failed"
    assert rows["hc-L2-lr2.5e-03"]["status"] == "diverged"
    assert rows["hc-L2-lr2.5e-03"]["diverged_at_step"] == "7"
    assert rows["hc-L2-lr2.5e-03"]["final_val_loss"] == ""
    assert "out of memory (fake)" in (tmp_path / "pre_ln-L4-lr1e-03" / "failure.txt").read_text()
    # Next sweep: only the failed run is retried; diverged stays diverged.
    again = FakeRunner()
    out = sweeplib.run_sweep(sweep, tmp_path, runner=again, progress=False)
    assert again.calls == ["pre_ln-L4-lr1e-03"] and out.ok
    assert out.diverged == ["hc-L2-lr2.5e-03"]
    assert not (tmp_path / "pre_ln-L4-lr1e-03" / "failure.txt").exists()
    assert read_csv(tmp_path / "results.csv")["pre_ln-L4-lr1e-03"]["status"] == "done"


def test_interrupted_run_resumes_in_its_directory(sweep, tmp_path):
    runner = FakeRunner(interrupt=["pre_ln-L2-lr2.5e-03"])
    with pytest.raises(KeyboardInterrupt):
        sweeplib.run_sweep(sweep, tmp_path, runner=runner, progress=False)
    run_dir = tmp_path / "pre_ln-L2-lr2.5e-03"
    assert not (run_dir / LOCK_FILE).exists()  # released on the way out
    rows = read_csv(tmp_path / "results.csv")
    assert rows["pre_ln-L2-lr1e-03"]["status"] == "done"
    assert rows["pre_ln-L2-lr2.5e-03"]["status"] == "pending"
    again = FakeRunner()
    sweeplib.run_sweep(sweep, tmp_path, runner=again, progress=False)
    assert again.calls == NAMES[1:]  # the interrupted run first, in its own directory
    assert json.loads((run_dir / "result.json").read_text())["resumed_from"] == 10


def test_preempted_run_stops_the_sweep(sweep, tmp_path):
    runner = FakeRunner(preempt=["pre_ln-L4-lr1e-03"])
    out = sweeplib.run_sweep(sweep, tmp_path, runner=runner, progress=False)
    assert runner.calls == NAMES[:3] and out.preempted == "pre_ln-L4-lr1e-03" and not out.ok
    assert read_csv(tmp_path / "results.csv")["pre_ln-L4-lr1e-03"]["status"] == "pending"


def test_changed_config_is_refused_but_execution_fields_may_change(spec_file, sweep, tmp_path):
    sweeplib.run_sweep(sweep, tmp_path, runner=FakeRunner(), progress=False)
    changed = sweeplib.expand(spec_file, ["--config.train.steps=9"])
    with pytest.raises(ConfigError, match=r"run 'pre_ln-L2-lr1e-03' .* was started with a "
                                          r"different config: train.steps 20 -> 9"):
        sweeplib.run_sweep(changed, tmp_path, runner=FakeRunner(), progress=False)
    moved = sweeplib.expand(spec_file, ["--config.parallel.fsdp=2", "--config.data.prefetch=0"])
    runner = FakeRunner()
    sweeplib.run_sweep(moved, tmp_path, runner=runner, progress=False)
    assert runner.calls == []


def test_a_new_spec_adds_runs_to_a_sweep_directory(sweep, tmp_path):
    """Swapping in a spec with a new aspect ratio trains only the new runs, and
    results.csv keeps every run the directory holds."""
    sweeplib.run_sweep(sweep, tmp_path, runner=FakeRunner(), progress=False)
    more = tmp_path / "more.py"
    more.write_text(SPEC.replace("(2, 4)", "(10,)").replace('("pre_ln", "hc")', '("hc",)'))
    runner = FakeRunner()
    sweeplib.run_sweep(sweeplib.expand(more), tmp_path, runner=runner, progress=False)
    assert runner.calls == ["hc-L10-lr1e-03", "hc-L10-lr2.5e-03"]
    rows = read_csv(tmp_path / "results.csv")
    assert list(rows) == ["hc-L10-lr1e-03", "hc-L10-lr2.5e-03", *sorted(NAMES)]
    assert {r["status"] for r in rows.values()} == {"done"}
    assert float(rows["pre_ln-L4-lr1e-03"]["aspect_ratio"]) == 30.0


def test_runs_recorded_by_older_or_other_checkouts_still_get_rows(sweep, tmp_path):
    """A run recorded before a field joined the schema reads it as its default; a
    run of a family this checkout does not know is counted with the backbone."""
    sweeplib.run_sweep(sweep, tmp_path, runner=FakeRunner(), progress=False)
    for name, family in (("old-L2", "hc"), ("gone-L2", "no_such_family")):
        record = json.loads((tmp_path / "hc-L2-lr1e-03" / RUN_RECORD).read_text())
        record["name"], record["config"]["model"]["family"] = name, family
        del record["config"]["model"]["impl"], record["config"]["model"]["residual"]["hc_n"]
        (tmp_path / name).mkdir()
        (tmp_path / name / RUN_RECORD).write_text(json.dumps(record))
    (old,) = [r for r in sweeplib.other_runs(sweep, tmp_path) if r.name == "old-L2"]
    assert old.config.model.impl == "xla" and old.config.model.residual.hc_n == 4
    rows = {r["name"]: r for r in sweeplib.write_results(sweep, tmp_path)}
    hc_params = sweep.by_name()["hc-L2-lr1e-03"].static_row()["params"]
    assert rows["old-L2"]["params"] == hc_params  # costed as hc, with its defaults
    assert rows["gone-L2"]["params"] == old.shape.total_params < hc_params
    assert rows["old-L2"]["status"] == rows["gone-L2"]["status"] == "pending"


# ------------------------------------------------------------------ locks


def _dead_pid() -> int:
    """A process id no process has on this host: above the largest pid Linux (2**22)
    or macOS (99998) gives (an owner that died: its pid is gone, as here)."""
    return 2**22 + 1


def _write_lock(run_dir: Path, host: str, pid: int, age: float = 0.0) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    path.write_text(json.dumps({"host": host, "pid": pid, "started": time.time() - age}))
    os.utime(path, (time.time() - age, time.time() - age))


def test_lock_is_exclusive_and_stale_locks_are_taken_over(tmp_path):
    first = RunLock(tmp_path)
    assert first.acquire()
    assert not RunLock(tmp_path).acquire()  # held by a live pid on this host
    first.release()
    assert not (tmp_path / LOCK_FILE).exists()
    # The owner died on this host: stale at once.
    _write_lock(tmp_path, socket.gethostname(), _dead_pid())
    with RunLock(tmp_path) as lock:
        assert lock.acquire()
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    # An owner on another host: held while its heartbeat is fresh, stale after stale_after.
    _write_lock(tmp_path, "elsewhere", 1, age=5.0)
    assert not RunLock(tmp_path, stale_after=60).acquire()
    assert RunLock(tmp_path, stale_after=2).acquire()


def test_lock_heartbeat_keeps_it_fresh(tmp_path):
    lock = RunLock(tmp_path, stale_after=0.4)
    assert lock.acquire()
    try:
        time.sleep(0.6)
        record = RunLock(tmp_path, stale_after=0.4).holder()
        assert record["age"] < 0.4  # touched by the heartbeat, so not stale
    finally:
        lock.release()


def test_runs_locked_by_another_process_are_skipped_and_reported(sweep, tmp_path):
    held = tmp_path / "hc-L2-lr1e-03"
    _write_lock(held, socket.gethostname(), os.getppid())  # a live process, not us
    runner = FakeRunner()
    out = sweeplib.run_sweep(sweep, tmp_path, runner=runner, progress=False)
    assert "hc-L2-lr1e-03" not in runner.calls and len(runner.calls) == 7
    assert out.held_elsewhere == ["hc-L2-lr1e-03"]
    assert read_csv(tmp_path / "results.csv")["hc-L2-lr1e-03"]["status"] == "running"
    (held / LOCK_FILE).unlink()  # the other process ended without finishing it
    again = FakeRunner()
    sweeplib.run_sweep(sweep, tmp_path, runner=again, progress=False)
    assert again.calls == ["hc-L2-lr1e-03"]


# --------------------------------------------------------------------- CLI


def test_cli_dry_run_list_and_json(spec_file, tmp_path, capsys):
    workdir = tmp_path / "w"
    assert cli_main(["sweep", "--config", str(spec_file), "--workdir", str(workdir),
                     "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "8 runs" in out and all(name in out for name in NAMES)
    assert not workdir.exists()  # a dry run writes nothing
    assert cli_main(["sweep", "--config", str(spec_file), "--workdir", str(workdir), "--list",
                     "--shard", "1/3"]) == 0
    assert capsys.readouterr().out.split() == NAMES[1::3]
    assert cli_main(["sweep", "--config", str(spec_file), "--workdir", str(workdir),
                     "--dry-run", "--json", "--run", "hc-*"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == NAMES[4:]
    assert rows[0]["overrides"] == {"model.family": "hc", "model.depth": 2, "train.lr": 1e-3}
    assert cli_main(["sweep", "--config", str(spec_file), "--workdir", str(workdir),
                     "--shard", "3/3", "--dry-run"]) == 2
    assert "--shard: expected i/N" in capsys.readouterr().err


# ---------------------------------------------------------------- variants

VARIANT_SPEC = """
from depthbench.config import base_config

def get_config():
    c = base_config()
    c.name = "variant_sweep"
    c.train.steps = 20
    return c

def get_sweep():
    return [{"model.family": f, "model.depth": 2, "train.lr": 3e-3}
            for f in ("hc", "hc+norm_then_sum", "moda+pre_norm+unrotated_query")]
"""


def test_variant_names_round_trip_through_sweep_results_and_report(tmp_path):
    from depthbench import report

    spec = tmp_path / "variants.py"
    spec.write_text(VARIANT_SPEC)
    sweep = sweeplib.expand(spec)
    names = ["hc-L2-lr3e-03", "hc+norm_then_sum-L2-lr3e-03",
             "moda+pre_norm+unrotated_query-L2-lr3e-03"]
    assert [r.name for r in sweep.runs] == names
    plain, normed, moda = (r.config for r in sweep.runs)
    assert plain.model.family == normed.model.family == "hc"
    assert plain.model.residual.readout == "sum_then_norm"  # the original's final default
    assert normed.model.residual.readout == "norm_then_sum"
    assert moda.model.family == "moda" and moda.model.residual.moda_norm == "pre"
    assert moda.model.residual.moda_depth_query == "unrotated"
    work = tmp_path / "work"
    sweeplib.run_sweep(sweep, work, runner=FakeRunner(), progress=False)
    rows = read_csv(work / "results.csv")
    assert [rows[n]["family"] for n in names] == ["hc", "hc+norm_then_sum",
                                                  "moda+pre_norm+unrotated_query"]
    # A second expansion (re-run) skips them, and the report keeps one row per label.
    again = FakeRunner()
    sweeplib.run_sweep(sweeplib.expand(spec), work, runner=again, progress=False)
    assert again.calls == []
    rep = report.write_report(work, plots=False)
    families = [fr.family for fr in rep.summary["micro"]]
    assert families == ["hc", "hc+norm_then_sum", "moda+pre_norm+unrotated_query"]
    text = (work / "report.md").read_text()
    assert "`hc+norm_then_sum`" in text and "variant's effect" in text
    assert "| hc+norm_then_sum |" in text


def test_bad_variants_are_one_line_errors(tmp_path):
    spec = tmp_path / "bad.py"
    spec.write_text(VARIANT_SPEC.replace("hc+norm_then_sum", "hc+sum_then_nrom"))
    with pytest.raises(ConfigError, match="variant 'sum_then_nrom' in 'hc\\+sum_then_nrom'"):
        sweeplib.expand(spec)
    spec.write_text(VARIANT_SPEC)
    with pytest.raises(ConfigError, match="model.residual.readout: the sweep sets it"):
        sweeplib.expand(spec, ["--config.model.residual.readout=sum_then_norm"])


def test_identity_holds_only_the_chosen_familys_residual_fields():
    """A run's identity is the shared fields plus its own family's: another
    family's fields (all of which run directories written before per-family
    configs hold) may differ or be absent without refusing the run."""
    # (the legacy run read out norm_then_sum, hc's default then)
    hc = apply_overrides(base_config(), ["model.family=hc",
                                         "model.residual.readout=norm_then_sum"]).to_dict()
    saved, now = copy.deepcopy(hc), copy.deepcopy(hc)
    # Every family's residual fields, as main wrote them before per-family configs.
    legacy = FIXTURES / "legacy_config" / "hc" / "config.json"
    saved["model"]["residual"] = json.loads(legacy.read_text())["model"]["residual"]
    foreign = [k for k in saved["model"]["residual"] if k not in
               registry.get("hc").config_fields()]
    assert foreign, "the schema holds other families' fields"
    for key in foreign:
        saved["model"]["residual"][key] = "a value no family takes"
    assert identity.config_changes(saved, now) == []
    now["model"]["residual"] = {k: v for k, v in now["model"]["residual"].items()
                                if k not in foreign}
    assert identity.config_changes(saved, now) == []
    now["model"]["residual"]["hc_n"] = 8
    assert identity.config_changes(saved, now) == [("model.residual.hc_n", 4, 8)]
    assert identity.identity(now)["model.residual.hc_n"] == 8
    assert not any(k in identity.identity(now) for k in
                   (f"model.residual.{f}" for f in foreign))
    now["model"]["family"] = "pre_ln"
    assert identity.config_changes(saved, now)[0] == ("model.family", "hc", "pre_ln")
