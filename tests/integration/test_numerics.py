"""Numerics of every registered family: a divergence is recorded, not a
crash; bf16 compute tracks fp32 compute.

Both run the real trainer (``depthbench train``) on a tiny model and a
pre-tokenised shard of arithmetic progressions (no tokenizer, no network).

bf16 against fp32.  Same initial parameters (fp32 master weights in both),
same 12 batches, learning rate 3e-3; only ``model.compute_dtype`` differs, so
every matmul input is rounded to bf16 (8 significant bits: unit roundoff
u = 2^-8 ~ 0.004) while accumulation, the loss and the optimizer stay fp32
(train/step.py).  Rounding logits of size ~1 by a relative u moves a
cross-entropy of ~4 nats by ~u ~ 0.004 nats, and over a dozen stable updates
the two trajectories drift apart slowly, so we allow :data:`BF16_TOL` =
0.02 nats (~5 u, 0.5% of the initial loss ln 64) at every step.  Measured on
this model (2-core CPU, jax 0.10): the largest difference of any family is
about 0.001 nats (pre_ln 0.0006, sandwich_ln 0.0012, hc 0.0010).  At lr 1e-2
sandwich_ln's fp32 loss oscillates (4.07 -> 4.21) and the difference reached
0.05: an unstable run amplifies rounding, which is why the comparison runs at
a stable learning rate.  The check fails both ways: a family whose bf16 path
loses precision (a Sinkhorn or a softmax over depth run in bf16) exceeds the
bound, and a family that ignores ``compute_dtype`` gives a difference of
exactly zero.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from toy_corpus import tiny_run_overrides

from depthbench import config as config_lib
from depthbench import parallel
from depthbench.cli import main as cli_main
from depthbench.errors import EXIT_DIVERGED
from depthbench.model.residual.protocol import registry
from depthbench.rundir.io import read_jsonl
from depthbench.train import state as state_lib
from depthbench.train import step as step_lib

FAMILIES = registry.names()
STEPS = 12
BF16_TOL = 0.02  # nats, at every step; see the module docstring
# These tests check numerics, not LLVM's code generation: compile at XLA's
# backend optimisation level 0 (as tests/unit/test_families_shared.py does).
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@pytest.fixture(scope="module")
def overrides(tmp_path_factory):
    return tiny_run_overrides(tmp_path_factory.mktemp("corpus"), STEPS, STEPS, n_docs=200, depth=4,
                              val_windows=2, lr=None, layer_stats_every=0)


def _own(family: str) -> list[str]:
    """The family's own overrides (a field of one family is no other's)."""
    return ["model.residual.attnres_blocks=4"] if family == "attnres_block" else []


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_divergence_is_recorded(family, overrides, tmp_path, capsys):
    """lr 1e3 from the first step (no warmup): the run ends with exit status 3
    and a result.json that says where it diverged, never a traceback."""
    workdir = tmp_path / family
    args = ["train", "--config", str(config_lib.base_spec_path()), "--workdir", str(workdir),
            "--no-progress", *(f"--config.{o}" for o in overrides + _own(family)),
            f"--config.model.family={family}", "--config.train.lr=1e3",
            "--config.train.warmup_fraction=0"]
    assert cli_main(args) == EXIT_DIVERGED == 3, capsys.readouterr().err[-3000:]
    r = json.loads((workdir / "result.json").read_text())
    assert r["diverged"] is True and r["status"] == "diverged" and r["family"] == family
    step = r["diverged_at_step"]
    assert 1 <= step <= STEPS and r["steps"] == step and r["final_val_loss"] is None
    last = read_jsonl(workdir / "metrics.jsonl")[-1]
    assert last["step"] == step
    assert last["loss"] is None or last["loss"] > 20.0  # NaN/inf (null) or above train.max_loss
    assert f"diverged at step {step}" in capsys.readouterr().err


def _batches(shard: Path, n: int, batch: int = 4, seq: int = 16) -> list[dict]:
    """``n`` fixed batches of consecutive windows (the same for both dtypes)."""
    tokens = np.load(shard).astype(np.int32)
    windows = tokens[: n * batch * (seq + 1)].reshape(n, batch, seq + 1)
    return [{"inputs": w[:, :-1], "targets": w[:, 1:]} for w in windows]


def _train_losses(config, batches) -> np.ndarray:
    """The losses of ``len(batches)`` train steps from the seed-0 state,
    through the trainer's own setup, init and train step."""
    s = state_lib.setup(config, parallel.mesh_from_config(config))
    state = state_lib.init_state(s, int(config.train.seed))
    global_batches = [parallel.host_batch_to_global(b, s.mesh) for b in batches]
    with s.context():
        step = step_lib.make_train_step(s).jitted.lower(state, global_batches[0]).compile(FAST)
    losses = []
    for batch in global_batches:
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return np.array(losses)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_tracks_fp32(family, overrides):
    shard = Path(next(o for o in overrides if o.startswith("data.paths=")).split("=", 1)[1])
    batches = _batches(shard, STEPS)
    losses = {}
    for dtype in ("float32", "bfloat16"):
        config = config_lib.load(config_lib.base_spec_path(), [
            *overrides, *_own(family), f"model.family={family}", f"model.compute_dtype={dtype}",
            "train.lr=3e-3"])
        losses[dtype] = _train_losses(config, batches)
    fp32, bf16 = losses["float32"], losses["bfloat16"]
    diff = np.abs(bf16 - fp32)
    # The parameters moved enough to matter (some families barely learn in 12 steps).
    assert np.all(np.isfinite(fp32)) and fp32.min() < fp32[0] - 0.05, f"{family}: {fp32}"
    assert diff.max() <= BF16_TOL, (
        f"{family}: bf16 - fp32 loss differs by {diff.max():.4f} nats at step "
        f"{diff.argmax() + 1} (tolerance {BF16_TOL}); per step: {np.round(diff, 4).tolist()}")
    assert diff.max() > 0, f"{family}: bf16 gives fp32's losses exactly: compute_dtype ignored?"
