"""Tiny configs and run directories shared by the analysis tests."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from noisy_params import perturbed
from paths import REPO

from depthbench import config as config_lib
from depthbench import parallel
from depthbench.train import state as state_lib
from depthbench.train.checkpoint import Checkpoints


def tiny_config(family: str = "pre_ln", depth: int = 3, **overrides):
    """A CPU-instant model: d 32, 4 heads, vocabulary 64."""
    o = {"model.family": family, "model.depth": depth, "model.suite": "", "model.d_model": 32,
         "model.d_ff": 64, "model.n_heads": 4, "model.n_kv_heads": 2, "model.vocab_size": 64,
         "model.remat_policy": "none", "train.seq_len": 16, "train.batch_size": 2,
         **overrides}
    return config_lib.load(REPO / "experiments" / "micro.py", [f"{k}={v}" for k, v in o.items()])


def write_run(run_dir: Path, config, seed: int = 0, noise: float = 0.05, step: int = 7,
              val_tokens: int = 0):
    """A run directory as ``depthbench train`` leaves it: config.json and one
    checkpoint of a full TrainState whose parameters are the init plus noise
    (so no parameter sits at an init value such as a zero query); with
    ``val_tokens`` also a random validation split recorded in config.json."""
    s = state_lib.setup(config, parallel.mesh_from_config(config))
    state = state_lib.init_state(s, seed)
    # The noise is drawn and added in numpy (noisy_params.perturbed): jax.random
    # would compile a program per leaf shape.
    state = state.replace(params=perturbed(state.params, seed + 1, noise), step=state.step + step)
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = {}
    if val_tokens:
        path = run_dir / "val.npy"
        ids = tokens(1, val_tokens, int(config.model.vocab_size), seed)[0]
        np.save(path, ids.astype(np.uint16))
        resolved = {"tokenizer": {"val_tokens_path": str(path)}}
    (run_dir / "config.json").write_text(json.dumps({**config.to_dict(), "resolved": resolved}))
    ckpt = Checkpoints(run_dir / "checkpoints", async_save=False)
    ckpt.save(step, state, ocp.args.JsonSave({}), {})
    ckpt.close()
    return jax.tree.map(np.asarray, jax.device_get(state.params))


def tokens(batch: int = 2, length: int = 16, vocab: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, (batch, length)).astype(np.int32)
