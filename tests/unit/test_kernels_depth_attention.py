"""The fused AttnRes depth attention against its reference (interpret mode, CPU).

Forward and gradients (sources, query, key-norm weight) over odd token
counts, a single source, all sources masked but one, fp32 (tight) and bf16
(looser), under both backends' tiling rules (``interpret`` emulates TPU,
``interpret_gpu`` Triton's power-of-two padding); the reference equals the
model's ``depth_mix.depth_mix``; the two-phase prefill equals one mix over all
sources.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_checks import BF16_TOL, FP32_TOL, assert_matches, rel_err
from noisy_params import normal

from depthbench.model.residual.parts.depth_mix import depth_mix
from pallas_kernels import (
    completed_sources_attention,
    depth_attention,
    depth_attention_reference,
    merge_partial,
)

EPS = 1e-6


def draws(n_src, lead, d, dtype=jnp.float32, seed=0):
    """Sources, query and key-norm weight, drawn in numpy (with ``jax.random``
    each shape would cost a compiled program)."""
    rng = np.random.default_rng(seed)
    v = normal(rng, (n_src, *lead, d))
    # Distinct source scales make the softmax far from uniform.
    v = v * (1.0 + np.arange(n_src, dtype=np.float32))[(...,) + (None,) * (len(lead) + 1)]
    q = normal(rng, (d,))
    w = 1.0 + normal(rng, (d,), 0.3)
    return v.astype(dtype), q, w


def inputs(n_src, lead, d, dtype=jnp.float32, seed=0):
    return jax.device_put(draws(n_src, lead, d, dtype, seed))


def mask(valid):
    return jax.device_put(np.asarray(valid, bool))


def fused(backend):
    return lambda v, valid, q, w: depth_attention(v, valid, q, w, EPS, backend)


def reference(v, valid, q, w):
    n_src, *lead, d = v.shape
    return depth_attention_reference(v.reshape(n_src, -1, d), valid, q, w, EPS).reshape(*lead, d)


@pytest.mark.parametrize(
    "backend, n_src, lead, d, valid",
    [
        ("interpret", 5, (3, 7), 32, [1, 1, 0, 1, 0]),  # 21 tokens: a padded tile
        ("interpret_gpu", 5, (19,), 24, [1, 0, 1, 1, 1]),  # odd width: padded to 32
        ("interpret", 1, (11,), 16, [1]),  # S = 1: the identity
        ("interpret", 6, (13,), 16, [0, 0, 0, 1, 0, 0]),  # all masked but one
    ],
)
def test_depth_attention_fp32_matches_reference(backend, n_src, lead, d, valid):
    v, q, w = inputs(n_src, lead, d)
    args = (v, mask(valid), q, w)
    # With one valid source the query and key-norm gradients are exactly zero
    # (the softmax is constant); the kernel's are rounding (p = exp(logit - lse)
    # is 1 to an ulp), compared with 10, below the size these gradients have
    # at this shape when several sources are valid (12 to 60).
    floor = 10.0 if sum(valid) == 1 else 1e-30
    assert_matches(fused(backend), reference, args, (0, 2, 3), FP32_TOL, floor)


def test_depth_attention_single_valid_source_reads_it_exactly():
    v, q, w = inputs(6, (13,), 16)
    valid = mask([0, 0, 0, 1, 0, 0])
    out = jax.jit(fused("interpret"))(v, valid, q, w)
    np.testing.assert_allclose(np.asarray(out), np.asarray(v)[3], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["interpret", "interpret_gpu"])
def test_depth_attention_bf16_matches_reference(backend):
    v, q, w = inputs(9, (2, 9), 32, jnp.bfloat16, seed=1)
    valid = mask([1, 1, 1, 0, 1, 1, 0, 1, 1])
    assert_matches(fused(backend), reference, (v, valid, q, w), (0, 2, 3), BF16_TOL)


def test_reference_is_the_models_depth_mix():
    """What the kernel is checked against is exactly what the model computes."""
    v, q, w = inputs(4, (2, 5), 16, seed=2)
    valid = mask([1, 1, 1, 0])
    model_mix = jax.jit(lambda v: depth_mix(v, valid, q, w, EPS))
    ref_mix = jax.jit(lambda v: reference(v, valid, q, w))
    assert rel_err(ref_mix(v), model_mix(v)) < 1e-6
    grad_model = jax.jit(jax.grad(lambda v: jnp.sum(jnp.sin(depth_mix(v, valid, q, w, EPS)))))(v)
    grad_ref = jax.jit(jax.grad(lambda v: jnp.sum(jnp.sin(reference(v, valid, q, w)))))(v)
    # The model's backward is written by hand (depth_mix._depth_mixes_bwd): the
    # same formula summed in another order, so a few fp32 ulps apart.
    assert rel_err(grad_ref, grad_model) < 1e-5


@pytest.mark.parametrize("backend", ["interpret", "interpret_gpu"])
def test_two_phase_prefill_equals_one_mix_over_all_sources(backend):
    """Phase 1 over the completed sources for K queries at once, then each
    query's merge with the running partial, equals the direct mix over
    ``[V; partial]``; phase 1 alone equals the mix over ``V``."""
    # Numpy arrays: the jitted functions take them as they are, and indexing or
    # concatenating them compiles nothing.
    v, _, _ = draws(4, (3, 5), 16, seed=3)
    valid = np.asarray([1, 1, 0, 1], bool)
    rng = np.random.default_rng(4)
    q_kd = normal(rng, (3, 16))
    w_kd = 1.0 + normal(rng, (3, 16), 0.2)
    partial = normal(rng, (3, 5, 16), 2.0)
    phase_1 = jax.jit(lambda *a: completed_sources_attention(*a, EPS, backend))
    o, lse = (np.asarray(x) for x in phase_1(v, valid, q_kd, w_kd))
    everything = np.concatenate([v, partial[None]])
    ref = jax.jit(reference)
    merge = jax.jit(lambda *a: merge_partial(*a, EPS))
    for i in range(3):
        assert rel_err(o[i], ref(v, valid, q_kd[i], w_kd[i])) < FP32_TOL
        merged = merge(o[i], lse[i], partial, q_kd[i], w_kd[i])
        direct = ref(everything, np.append(valid, True), q_kd[i], w_kd[i])
        assert rel_err(merged, direct) < FP32_TOL


def test_bad_backend_is_one_clear_error():
    v, q, w = inputs(2, (4,), 8)
    with pytest.raises(ValueError, match="backend 'cuda'.*allowed"):
        depth_attention(v, mask([1, 1]), q, w, EPS, "cuda")
