"""Learning rates across depth (unit): the transfer verdict on a synthetic
results table (known answers), the report section, the run counts (paper-400m
from its suite), and the two-phase sweep with a fake trainer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from depthbench import lr_transfer
from depthbench import sweep as sweeplib
from depthbench.config import ConfigError
from depthbench.configs import paper_400m
from depthbench.report import md_table as _md_table
from depthbench.sweep import transfer

GRID = (1e-3, 3e-3, 1e-2)


def _rows(family: str, losses: dict[int, tuple], status: dict | None = None) -> list[dict]:
    """One row per (depth, rate); ``losses[depth]`` holds one loss per rate of GRID
    (None: diverged); ``status`` overrides some rows' status by (depth, rate)."""
    out = []
    for depth, values in losses.items():
        for lr, loss in zip(GRID, values, strict=True):
            state = (status or {}).get((depth, lr), "done" if loss is not None else "diverged")
            out.append({"name": f"{family}-L{depth}-lr{lr}", "suite": "micro", "family": family,
                        "depth": depth, "lr": lr, "final_val_loss": loss, "status": state})
    return out


def _table() -> list[dict]:
    return (
        # Same best rate (3e-3) at both depths: transfers at no cost.
        _rows("same", {2: (3.2, 3.0, 3.1), 10: (3.3, 2.9, 3.4)})
        # Best 3e-3 at L2, 1e-3 at L10: one step apart, transfers; reusing costs 0.05.
        + _rows("one_step", {2: (3.2, 3.0, 3.1), 4: (3.1, 3.0, 3.2), 10: (2.85, 2.9, 3.4)})
        # Best 1e-2 at L2, 1e-3 at L10: two steps, does not; at the grid's edges.
        + _rows("two_steps", {2: (3.3, 3.2, 3.0), 10: (2.8, 2.9, None)})
        # The deep shape at the shallow best diverged (and is still the best elsewhere).
        + _rows("diverges", {2: (3.3, 3.1, 3.0), 10: (2.9, 2.8, None)})
        # A deep run still pending: no verdict yet.
        + _rows("pending", {2: (3.2, 3.0, 3.1), 10: (3.3, 2.9, None)},
                status={(10, 1e-2): "pending"})
        # One learning rate only: nothing to say.
        + [{"name": f"one_lr-L{d}", "suite": "micro", "family": "one_lr", "depth": d,
            "lr": 3e-3, "final_val_loss": 3.0, "status": "done"} for d in (2, 10)]
    )


def test_transfer_verdicts_on_a_synthetic_table():
    found = {v.family: v for v in lr_transfer.verdicts(_table())}
    assert list(found) == ["same", "one_step", "two_steps", "diverges", "pending"]
    same = found["same"]
    assert same.verdict == "transfers" and same.steps_apart == 0 and same.cost == 0.0
    assert same.best == ((2, 3e-3), (10, 3e-3)) and same.grid == GRID and not same.edge
    one = found["one_step"]
    assert one.verdict == "transfers" and one.steps_apart == 1
    assert one.best == ((2, 3e-3), (4, 3e-3), (10, 1e-3))
    assert one.cost == pytest.approx(2.9 - 2.85) and one.edge  # 1e-3 is the grid's end
    two = found["two_steps"]
    assert two.verdict == "does not transfer" and two.steps_apart == 2 and two.edge
    assert two.cost is None and two.cost_note == "diverged"
    assert found["diverges"].verdict == "does not transfer"
    assert found["diverges"].best == ((2, 1e-2), (10, 3e-3))
    assert found["pending"].verdict == "incomplete" and found["pending"].steps_apart is None


def test_report_section_says_which_families_transfer():
    lines = lr_transfer.markdown_lines(_table(), _md_table)
    text = "\n".join(lines)
    assert lines[0] == "## Learning rate across depth"
    assert "Transfers: same, one_step.  Does not: two_steps, diverges." in text
    assert "| one_step | 1e-03, 3e-03, 1e-02 | L2 3e-03, L4 3e-03, L10 1e-03 | 1 | +0.0500 at L10" \
        in text
    # The five families with a verdict have 6 + 9 + 6 + 6 + 6 = 33 runs; tuned at L2
    # only: three rates there plus one run per other depth, 5 x 3 + (1 + 2 + 1 + 1 + 1).
    assert "would train 21 of these 33 runs" in text
    assert lr_transfer.markdown_lines(_table()[-2:], _md_table) == []  # one rate: no section


def test_run_counts_known_answers():
    items = [("a", d) for d in (2, 4, 8) for _ in range(4)] + [("b", d) for d in (2, 8)]
    assert transfer.count_runs(items, 2) == (14, 4 + 2 + 1 + 1)
    assert transfer.count_runs(items, None) == (14, 8)
    # paper-400m, from its suite: every design's rates at one depth, one run elsewhere.
    sweep = sweeplib.expand("paper_400m")
    designs, lrs = len(paper_400m.DESIGNS), len(paper_400m.LRS)
    depths = len({r.config.model.depth for r in sweep.runs})
    plan = transfer.plan(sweep, "/nonexistent-depthbench-dir", 16)
    assert plan.counts() == (designs * depths * lrs, designs * lrs + designs * (depths - 1))
    assert plan.counts() == (280, 100)
    assert len(plan.phase1) == designs * lrs and plan.phase2 == ()
    assert len(plan.waiting) == 280 - 40


SPEC = """
from depthbench.config import base_config

def get_config():
    c = base_config()
    c.train.steps = 20
    return c

def get_sweep():
    return [{"model.family": f, "model.depth": d, "train.lr": lr}
            for f in ("pre_ln", "hc") for d in (2, 4, 6) for lr in (1e-3, 3e-3, 1e-2)]
"""


def _fake_loss(config) -> float:
    """pre_ln is best at 3e-3 at every depth; hc at 1e-2 at L2."""
    best = {"pre_ln": 3e-3, "hc": 1e-2}[config.model.family]
    return 3.0 + 0.1 * abs(math.log(config.train.lr / best)) - 0.01 * config.model.depth


class _Fake:
    def __init__(self, fail=()):
        self.calls, self.fail = [], set(fail)

    def __call__(self, config, workdir, *, progress=True):
        name = Path(workdir).name
        self.calls.append(name)
        if name in self.fail:
            raise RuntimeError("fake failure")
        result = {"final_val_loss": _fake_loss(config), "diverged": False, "status": "finished"}
        (Path(workdir) / "result.json").write_text(json.dumps(result))
        return result


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "grid.py"
    path.write_text(SPEC)
    return sweeplib.expand(path)


def test_two_phases_train_the_best_rate_elsewhere_and_rerun_skips(grid, tmp_path):
    fake = _Fake()
    out = transfer.run_transfer(grid, tmp_path, 2, runner=fake, progress=False)
    phase1 = [f"{f}-L2-lr{lr}" for f in ("pre_ln", "hc") for lr in ("1e-03", "3e-03", "1e-02")]
    phase2 = ["pre_ln-L4-lr3e-03", "pre_ln-L6-lr3e-03", "hc-L4-lr1e-02", "hc-L6-lr1e-02"]
    assert fake.calls == phase1 + phase2 and out.ok
    assert sorted(out.trained) == sorted(phase1 + phase2)
    rows = {r["name"]: r for r in out.rows}
    assert set(rows) == set(phase1 + phase2)  # results.csv lists the planned runs only
    again = _Fake()
    out = transfer.run_transfer(grid, tmp_path, 2, runner=again, progress=False)
    assert again.calls == [] and sorted(out.skipped) == sorted(phase1 + phase2)


def test_an_unfinished_phase_one_holds_back_only_its_family(grid, tmp_path):
    fake = _Fake(fail=["hc-L2-lr3e-03"])
    out = transfer.run_transfer(grid, tmp_path, 2, runner=fake, progress=False)
    assert out.failed == ["hc-L2-lr3e-03"] and not out.ok
    assert [c for c in fake.calls if "-L2-" not in c] == ["pre_ln-L4-lr3e-03",
                                                          "pre_ln-L6-lr3e-03"]
    plan = transfer.plan(grid, tmp_path, 2)
    assert set(plan.waiting) == {f"hc-L{d}-lr{lr}" for d in (4, 6)
                                 for lr in ("1e-03", "3e-03", "1e-02")}
    retry = _Fake()  # the next run retries the failure, then starts hc's phase 2
    out = transfer.run_transfer(grid, tmp_path, 2, runner=retry, progress=False)
    assert retry.calls == ["hc-L2-lr3e-03", "hc-L4-lr1e-02", "hc-L6-lr1e-02"] and out.ok


def test_bad_transfer_depths_are_one_line_errors(grid, tmp_path):
    with pytest.raises(ConfigError, match="--transfer-lr-from: the sweep has no depth 3; its "
                                          "depths: 2, 4, 6"):
        transfer.plan(grid, tmp_path, 3)
    one_rate = sweeplib.Sweep(grid.spec, (), tuple(r for r in grid.runs
                                                   if r.config.train.lr == 1e-3))
    with pytest.raises(ConfigError, match="one learning rate per shape"):
        transfer.plan(one_rate, tmp_path, 2)
    assert list(tmp_path.iterdir()) == []
