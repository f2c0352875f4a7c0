"""`depthbench sweep --transfer-lr-from L` on the command line (integration):
the phases a dry run and --list show, the savings line, bad input."""

from __future__ import annotations

import pytest

from depthbench.cli import main

SPEC = """
from depthbench.configs import quickstart

get_config = quickstart.get_config


def get_sweep():
    grid = [(d, lr) for d in (2, 4, 6) for lr in (1e-3, 3e-3)]
    return [{"model.family": f, "model.depth": d, "train.lr": lr}
            for f in ("pre_ln", "completep+lr_rule") for d, lr in grid]
"""

@pytest.fixture()
def spec(tmp_path):
    path = tmp_path / "grid.py"
    path.write_text(SPEC)
    return path


def test_dry_run_and_list_show_phase_one_and_the_savings(spec, tmp_path, capsys):
    workdir = tmp_path / "runs"
    assert main(["sweep", "--config", str(spec), "--workdir", str(workdir), "--list",
                 "--transfer-lr-from", "4"]) == 0
    out, err = capsys.readouterr()
    assert out.split() == [f"{f}-L4-lr{lr}" for f in ("pre_ln", "completep+lr_rule")
                           for lr in ("1e-03", "3e-03")]
    # 2 families x 3 depths x 2 rates = 12; tuned at L4: 2 x 2 + 2 x 2 other depths = 8.
    assert "phase 1 4 runs, phase 2 0 runs ready, 8 waiting for phase 1; 8 of the grid's " \
           "12 runs (4 saved)" in err
    assert main(["sweep", "--config", str(spec), "--workdir", str(workdir), "--dry-run",
                 "--transfer-lr-from", "4"]) == 0
    out = capsys.readouterr().out
    assert "4 runs: 4 pending (dry run: nothing trained)" in out
    assert not workdir.exists()


@pytest.mark.parametrize("depth, message", [
    ("5", "--transfer-lr-from: the sweep has no depth 5; its depths: 2, 4, 6"),
    ("x", "--transfer-lr-from: expected a depth of the sweep, got 'x'"),
])
def test_bad_depth_is_one_line(spec, tmp_path, capsys, depth, message):
    assert main(["sweep", "--config", str(spec), "--workdir", str(tmp_path / "runs"),
                 "--transfer-lr-from", depth]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"depthbench: error: {message}"]
    assert not (tmp_path / "runs").exists()
