"""The jitted train step on one device: known values, dtypes, layer statistics.

(The sharded and gradient-accumulation equivalences run on a fake 8-device
mesh in tests/unit/test_parallel.py.)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from depthbench import config as config_lib
from depthbench import parallel
from depthbench.model.transformer import Transformer
from depthbench.train import layer_stats
from depthbench.train import state as state_lib
from depthbench.train import step as step_lib

VOCAB = 64
TINY = ["model.suite=", "model.d_model=32", "model.d_ff=64", "model.depth=2", "model.n_heads=4",
        f"model.vocab_size={VOCAB}", "model.remat_policy=none", "train.seq_len=8",
        "train.batch_size=4", "train.steps=10", "train.lr=1e-2", "train.warmup_fraction=0"]


def _batch(seed=0):
    toks = np.random.default_rng(seed).integers(0, VOCAB, (4, 9)).astype(np.int32)
    return {"inputs": toks[:, :-1], "targets": toks[:, 1:]}


@pytest.fixture(scope="module")
def mesh():
    return parallel.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})


@pytest.fixture(scope="module")
def fp32(mesh):
    s = state_lib.setup(config_lib.load(config_lib.base_spec_path(), TINY), mesh)
    state = state_lib.init_state(s, 0)
    init = jax.tree.map(np.asarray, state)  # kept: the step donates ``state``
    new, metrics = step_lib.make_train_step(s)(state, parallel.host_batch_to_global(_batch(),
                                                                                    mesh))
    return s, init, new, jax.device_get(metrics)


def test_first_step_known_values(fp32):
    s, init, new, m = fp32
    init_params = init.params
    # Small init (std 0.02): the first loss is that of a uniform guess.
    assert m["loss"] == pytest.approx(math.log(VOCAB), abs=0.05)
    assert m["lr"] == pytest.approx(1e-2)  # no warmup: the peak at update 0
    assert int(new.step) == 1
    assert np.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    # Adam's first update moves every weight matrix by about lr (sign of the gradient).
    delta = np.abs(np.asarray(new.params["blocks"]["mlp"]["up"]) -
                   init_params["blocks"]["mlp"]["up"])
    assert np.median(delta) == pytest.approx(1e-2, rel=0.05)
    assert new.params["embed"].dtype == jnp.float32


def test_the_init_traces_the_model_once_and_gives_model_inits_parameters(mesh, monkeypatch):
    """The set-up's shapes and the init program share one trace of the model
    (transformer.params_init; two before), and the parameters are
    ``model.init``'s own, bit for bit."""
    traced = []
    model_init = Transformer.init
    monkeypatch.setattr(Transformer, "init",
                        lambda self, *a, **kw: traced.append(1) or model_init(self, *a, **kw))
    s = state_lib.setup(config_lib.load(config_lib.base_spec_path(), TINY), mesh)
    state = state_lib.init_state(s, 7)
    assert len(traced) == 1
    init_key, _ = jax.random.split(jax.random.key(7))
    tokens = jnp.zeros((1, s.seq_len), jnp.int32)
    with s.context():
        direct = jax.jit(lambda k: nn.unbox(model_init(s.model, k, tokens)["params"]))(init_key)
    assert jax.tree.structure(direct) == jax.tree.structure(state.params)
    for ours, theirs in zip(jax.tree.leaves(state.params), jax.tree.leaves(direct), strict=True):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


def test_state_is_sharded_as_declared(fp32):
    s, _, new, _ = fp32
    for leaf, sh in zip(jax.tree.leaves(new), jax.tree.leaves(s.state_shardings), strict=True):
        assert leaf.sharding.is_equivalent_to(sh, leaf.ndim)


def test_bf16_compute_keeps_fp32_master_weights(mesh, fp32):
    _, init, _, m32 = fp32
    s = state_lib.setup(config_lib.load(config_lib.base_spec_path(),
                                        TINY + ["model.compute_dtype=bfloat16"]), mesh)
    state = jax.device_put(init, s.state_shardings)  # same fp32 initial state
    new, m = step_lib.make_train_step(s)(state, parallel.host_batch_to_global(_batch(), mesh))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new.params))
    assert float(m["loss"]) == pytest.approx(float(m32["loss"]), abs=2e-2)
    assert float(m["loss"]) != float(m32["loss"])  # bf16 really ran


def test_layer_stats_known_answer(mesh, fp32):
    s, init, _, _ = fp32
    init_params = init.params
    tokens = _batch(1)["inputs"]
    stats = jax.device_get(layer_stats.make_layer_stats(s)(
        init_params, parallel.host_batch_to_global(_batch(1), mesh)))
    assert stats["state_rms"].shape == (3,) and stats["update_rms"].shape == (2,)
    # z_0 is the embedding output (pre_ln): its RMS over the batch is known.
    x0 = init_params["embed"][tokens]
    assert stats["state_rms"][0] == pytest.approx(float(np.sqrt(np.mean(x0 ** 2))), rel=1e-5)
    np.testing.assert_allclose(stats["update_ratio"],
                               stats["update_rms"] / stats["state_rms"][:-1], rtol=1e-6)
    assert np.all(stats["update_rms"] > 0)
