"""Decoding with a KV cache (depthbench.model.decode): prefill plus decode steps
give the full forward's logits at every position (fp32, 1e-5 relative); the
cache holds each layer's kv heads in the compute dtype; padding never leaks;
a family that carries state across positions (capabilities.PositionState)
gets its carry through the cache.  Every family and variant, sharded, with
Pallas and imported: tests/integration/test_decode_families.py."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decode_checks import SHAPE, TOKENS, decoded_and_full, noisy_init, relative
from flax import linen as nn

from depthbench.model import decode
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.base import ResidualFamily, gate
from depthbench.model.residual.protocol.capabilities import PositionState
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer


@pytest.mark.parametrize("family", ["pre_ln", "moda"])
def test_prefill_and_decode_steps_give_the_forward_logits(family):
    """Rows of 3 and 6 prompt tokens, 4 steps each: 10 positions, each compared.
    moda: the joint softmax takes the cached sequence keys as one more part."""
    model = Transformer(ModelSpec.from_shape(SHAPE, family=family))
    params = noisy_init(model)
    got, want, cache = jax.jit(lambda p, t: decoded_and_full(model, p, t))(params, TOKENS)
    assert float(np.std(want)) > 0.3  # logits far from uniform: a wrong key would show
    assert relative(got, want) < 1e-5
    np.testing.assert_array_equal(cache.lengths_b, [3 + 4, 6 + 4])


def test_padding_never_leaks():
    """Other tokens in the prompts' padding and in the cache's unwritten slots
    change no logit, bitwise: causal attention and the slot mask weigh them 0."""
    model = Transformer(ModelSpec.from_shape(SHAPE, "pre_ln"))
    params = noisy_init(model)
    lengths = jnp.array([3, 6])

    @jax.jit
    def first_and_next(prompt_bp, poison):
        logits, cache = decode.prefill(model, params, prompt_bp, lengths, 12)
        unwritten = jnp.arange(12)[None, None, None, :, None] >= lengths[None, :, None, None, None]
        cache = cache._replace(k_lbksh=jnp.where(unwritten, poison, cache.k_lbksh),
                               v_lbksh=jnp.where(unwritten, poison, cache.v_lbksh))
        step, _ = decode.decode_step(model, params, cache, jnp.array([[5], [7]]))
        return logits, step

    clean = first_and_next(jnp.where(jnp.arange(8) < lengths[:, None], TOKENS[:, :8], 0), 0.0)
    noisy = first_and_next(jnp.where(jnp.arange(8) < lengths[:, None], TOKENS[:, :8], 9), 1e4)
    for a, b in zip(clean, noisy, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_cache_holds_kv_heads_in_the_compute_dtype():
    """GQA: 2 kv heads of 4, ``[L, B, K, S, H]``, bfloat16 when the model computes in
    it (parameters fp32), lengths per row; a family with per-token state carries
    nothing (shapes only: nothing compiled)."""
    spec = ModelSpec.from_shape(SHAPE, family="hc", compute_dtype="bfloat16")
    model = Transformer(spec)
    params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), TOKENS)["params"]))
    logits, cache = jax.eval_shape(
        lambda p: decode.prefill(model, p, jnp.zeros((3, 8), jnp.int32),
                                 jnp.array([1, 8, 4]), 16), params)
    shape = (SHAPE.depth, 3, SHAPE.n_kv_heads, 16, SHAPE.head_dim)
    assert cache.k_lbksh.shape == cache.v_lbksh.shape == shape
    assert cache.k_lbksh.dtype == cache.v_lbksh.dtype == jnp.bfloat16
    assert (cache.lengths_b.shape, cache.carry) == ((3,), None)
    assert logits.shape == (3, SHAPE.vocab_size) and logits.dtype == jnp.float32


@dataclasses.dataclass(frozen=True)
class RunningMean(ResidualFamily, PositionState):
    """A family whose readout also sees the running mean of the embeddings of
    every token so far: state at a token depends on earlier tokens other than
    through attention, so a decoder must carry ``(sum, count)`` across steps."""

    name = "test_running_mean"

    def init_state(self, g, x0):
        sum_btd = jnp.cumsum(x0.astype(jnp.float32), axis=1)
        count_bt = jnp.broadcast_to(jnp.arange(1, x0.shape[1] + 1, dtype=jnp.float32),
                                    x0.shape[:2])
        return {"x": x0, "sum": sum_btd, "count": count_bt}

    def read(self, p, state, site):
        return state["x"], {}

    def write(self, p, state, y, site, aux, active):
        return {**state, "x": gate(active, state["x"] + y, state["x"])}

    def readout(self, g, state, final_norm):
        mean_btd = state["sum"] / state["count"][..., None]
        return final_norm(state["x"] + mean_btd.astype(state["x"].dtype))

    def resume(self, g, state, carry):
        return {**state, "sum": state["sum"] + carry["sum"][:, None],
                "count": state["count"] + carry["count"][:, None]}

    def carry(self, g, state, at_b):
        rows = jnp.arange(at_b.shape[0])
        return {"sum": state["sum"][rows, at_b], "count": state["count"][rows, at_b]}


@pytest.fixture
def running_mean():
    registry.register(RunningMean)
    yield RunningMean.name
    registry.unregister(RunningMean.name)


def test_a_family_carrying_state_across_positions_decodes_exactly(running_mean):
    model = Transformer(ModelSpec.from_shape(SHAPE, family=running_mean))
    params = noisy_init(model)
    got, want, cache = jax.jit(lambda p, t: decoded_and_full(model, p, t))(params, TOKENS)
    assert relative(got, want) < 1e-5
    # The carry counts the tokens each row has seen: 3 + 4 and 6 + 4.
    np.testing.assert_array_equal(cache.carry["count"], [7.0, 10.0])
    assert not isinstance(registry.build(ModelSpec.from_shape(SHAPE, "pre_ln")), PositionState)
