"""The micro config on the real micro corpus (fetched and tokenised once, cached)."""

from __future__ import annotations

import math

import pytest
from paths import REPO

from depthbench import config as config_lib
from depthbench.rundir.io import read_jsonl
from depthbench.shapes import suite
from depthbench.train import loop

MICRO = REPO / "experiments" / "micro.py"


def test_micro_spec_is_the_documented_run():
    c = config_lib.load(MICRO)
    assert c.model.family == "pre_ln" and c.model.suite == "micro" and c.data.corpus == "micro"
    assert suite("micro").shape(c.model.depth).total_params < 2e6  # CPU-sized
    assert c.train.steps * c.train.batch_size * c.train.seq_len >= 500_000  # enough to learn
    assert c.train.checkpoint_every < c.train.steps  # a kill loses little


@pytest.mark.slow
def test_micro_model_learns_real_text(tmp_path):
    """30 steps of a small pre_ln model on real English: the loss falls from
    ln(vocab) (a uniform guess) by more than a nat (unigram statistics and beyond)."""
    config = config_lib.load(MICRO, [
        "model.suite=", "model.d_model=64", "model.depth=2", "model.n_heads=4",
        "train.seq_len=64", "train.batch_size=8", "train.steps=30", "train.lr=1e-2",
        "train.log_every=1", "train.eval_every=30", "train.checkpoint_every=30",
        "train.layer_stats_every=0"])
    result = loop.run(config, tmp_path / "micro", progress=False)
    losses = [r["loss"] for r in read_jsonl(tmp_path / "micro" / "metrics.jsonl")]
    print(f"micro: loss {losses[0]:.3f} -> {losses[-1]:.3f}, val {result['final_val_loss']:.3f}, "
          f"{result['tokens_per_sec']:,.0f} tokens/s")
    initial = math.log(config.model.vocab_size)
    assert losses[0] == pytest.approx(initial, abs=0.1)
    assert min(losses[-5:]) < initial - 1.0
    assert result["final_val_loss"] < initial - 1.0
    assert not result["diverged"]
