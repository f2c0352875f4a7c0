"""The fused MoDA attention (``pallas_kernels.moda_attention``) against its reference.

* the reference equals the model's XLA path (``attention_with_depth``: the
  causal part and the depth parts merged by their log-sum-exps);
* interpret mode, under both backends' tiling rules (``interpret``: TPU's,
  ``interpret_gpu``: Triton's power-of-two tiles and padded head dim): the
  output and the gradients of every differentiable operand (``q, k, v``,
  the depth query, each group's depth keys and values) equal the
  reference's in fp32 (and bf16, looser), with GQA (4 query heads on 2 key
  heads), two depth groups with different key-head counts (2 and 1) and
  slot counts, masked slots, a group with no valid slot, and a token count
  that is not a tile multiple;
* the forward and the backward lower for ``tpu`` (Mosaic) and ``cuda``
  (Triton) with ``jax.export`` (the pattern of test_kernels_lowering.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from kernel_checks import BF16_TOL, FP32_TOL, assert_matches, rel_err
from noisy_params import normal

from depthbench.model.residual.parts.moda_attention import attention_with_depth
from pallas_kernels import moda_attention, moda_attention_reference

B, N, K, H = 2, 4, 2, 8
GROUPS = [(2, [1, 0, 1]), (1, [0, 1, 1, 0, 1])]  # (key heads, valid slots)


def inputs(t, groups=GROUPS, dtype=jnp.float32, seed=0):
    """Drawn in numpy (with ``jax.random`` each shape costs a compiled program)."""
    rng = np.random.default_rng(seed)
    q, qd = (normal(rng, (B, t, N, H)) for _ in range(2))
    k, v = (normal(rng, (B, t, K, H)) for _ in range(2))
    arrays, valids = [q, k, v, qd], []
    for g, valid in groups:
        # Larger depth keys: the depth slots take a real share of the softmax.
        arrays += [normal(rng, (B, t, g, len(valid), H), 2.0),
                   normal(rng, (B, t, g, len(valid), H))]
        valids.append(jax.device_put(np.asarray(valid, bool)))
    return jax.device_put([a.astype(dtype) for a in arrays]), valids


def with_groups(fn, valids):
    """``fn(q, k, v, qd, groups)`` as a function of the arrays alone."""
    def call(q, k, v, qd, *depth):
        groups = [(depth[2 * i], depth[2 * i + 1], valid) for i, valid in enumerate(valids)]
        return fn(q, k, v, qd, groups)

    return call


def fused(backend):
    return lambda q, k, v, qd, groups: moda_attention(q, k, v, qd, groups, backend)


def test_reference_is_the_models_xla_path():
    arrays, valids = inputs(13)
    # Jitted, one program each (run eagerly, every op would compile one of its own).
    out = jax.jit(with_groups(moda_attention_reference, valids))(*arrays)
    xla = jax.jit(with_groups(attention_with_depth, valids))(*arrays)
    assert rel_err(out, xla) < 1e-6


@pytest.mark.parametrize("backend, t", [("interpret", 21), ("interpret_gpu", 19)])
def test_fp32_output_and_every_gradient_match_the_reference(backend, t):
    arrays, valids = inputs(t)
    argnums = tuple(range(len(arrays)))
    assert_matches(with_groups(fused(backend), valids),
                   with_groups(moda_attention_reference, valids), arrays, argnums, FP32_TOL)


def test_empty_group_and_shared_query_match_the_reference():
    """A group with no valid slot weighs nothing (its keys get zero gradient);
    the rotated depth query is the sequence query itself."""
    arrays, valids = inputs(9, [(2, [0, 0]), (2, [1, 1, 1])], seed=2)
    q, k, v, _, *depth = arrays

    def shared(fn):
        inner = with_groups(fn, valids)
        return lambda q, k, v, *d: inner(q, k, v, q, *d)

    args = [q, k, v, *depth]
    assert_matches(shared(fused("interpret")), shared(moda_attention_reference), args,
                   tuple(range(len(args))), FP32_TOL, floor=1.0)


@pytest.mark.parametrize("backend", ["interpret", "interpret_gpu"])
def test_bf16_matches_the_reference(backend):
    arrays, valids = inputs(12, dtype=jnp.bfloat16, seed=1)
    assert_matches(with_groups(fused(backend), valids),
                   with_groups(moda_attention_reference, valids), arrays,
                   tuple(range(len(arrays))), BF16_TOL)


# ---------------------------------------------------------------- lowering
TRITON_OK = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
PLATFORMS = [("tpu", "tpu", "tpu_custom_call"), ("gpu", "cuda", "__gpu$xla.gpu.triton")]


def lower(fn, args, platform):
    exported = export.export(jax.jit(fn), platforms=[platform], disabled_checks=TRITON_OK)(*args)
    return exported.mlir_module()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend, platform, call", PLATFORMS, ids=["tpu", "cuda"])
def test_lowers_forward_and_backward(backend, platform, call, dtype):
    """Realistic kinds of shape: d_h 64, 8 query heads on 2 key heads, depth
    groups of 2 and 4 key heads with 7 slots (not a power of two), 150 tokens
    (padded to a tile multiple)."""
    t, n, kv, h, m = 150, 8, 2, 64, 7

    def spec(*shape, dt=dtype):
        return jax.ShapeDtypeStruct(shape, dt)

    args = (spec(B, t, n, h), spec(B, t, kv, h), spec(B, t, kv, h), spec(B, t, n, h),
            spec(B, t, kv, m, h), spec(B, t, kv, m, h), spec(B, t, 4, m, h), spec(B, t, 4, m, h))
    valid = jax.device_put(np.ones(m, bool))
    fn = with_groups(lambda *a: moda_attention(*a, backend=backend), [valid, valid])
    forward = lower(fn, args, platform)
    assert call in forward and "moda_attention_fwd" in forward
    loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))  # noqa: E731
    backward = lower(jax.grad(loss, argnums=tuple(range(len(args)))), args, platform)
    for kernel in ("bwd_dq", "bwd_dkv", "bwd_depth"):
        assert f"moda_attention_{kernel}" in backward, kernel
