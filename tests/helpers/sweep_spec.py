"""A tiny sweep spec (2 families x 2 depths x 2 learning rates, 8 runs) with its
run names, the ``spec_file`` fixture that writes it, and a reader of a sweep's
results.csv: shared by the sweep tests of both tiers (a ``pytest_plugins``
module of tests/conftest.py; tests/unit/test_sweep.py,
tests/integration/test_sweep_processes.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

SPEC = """
from depthbench.config import base_config

def get_config():
    c = base_config()
    c.name = "test_sweep"
    c.train.steps = 20
    return c

def get_sweep():
    return [{"model.family": f, "model.depth": d, "train.lr": lr}
            for f in ("pre_ln", "hc") for d in (2, 4) for lr in (1e-3, 2.5e-3)]
"""
NAMES = [f"{f}-L{d}-lr{lr}" for f in ("pre_ln", "hc") for d in (2, 4)
         for lr in ("1e-03", "2.5e-03")]


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "tiny_sweep.py"
    path.write_text(SPEC)
    return path


def tiny_config(checkpoint_every: int, layer_stats_every: int) -> str:
    """The body of a spec's ``get_config`` (up to its ``return c``) for real sweeps
    that train in seconds: d 32, 2 heads, 4 steps of 2 x 16 tokens, 2 validation
    windows (tests/integration/test_sweep_end_to_end.py, test_finetune_sweep.py)."""
    return f"""    c = base_config()
    c.model.suite = ""
    c.model.d_model = 32
    c.model.n_heads = 2
    t = c.train
    t.steps, t.batch_size, t.seq_len = 4, 2, 16
    t.log_every, t.eval_every = 2, 4
    t.checkpoint_every, t.layer_stats_every = {checkpoint_every}, {layer_stats_every}
    c.data.val_windows = 2
"""


def read_csv(path: Path) -> dict[str, dict]:
    with open(path) as f:
        return {row["name"]: row for row in csv.DictReader(f)}
