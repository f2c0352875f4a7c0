"""Every kernel, forward and backward, lowers for the real backends without them.

``jax.export`` lowers for ``tpu`` (Mosaic) and ``cuda`` (Pallas Triton) on
this CPU machine, so Mosaic and Triton lowering errors (block shapes, an
unsupported primitive, a power-of-two violation) surface here rather than
on an accelerator.  Shapes are realistic in kind: bf16 and fp32 streams, a
source count that is not a power of two, a token count that needs padding.
The exported module must contain the backend's kernel call.
"""

import jax
import jax.numpy as jnp
import pytest
from jax import export

from pallas_kernels import (
    completed_sources_attention,
    depth_attention,
    hc_pre,
    mhc_pre,
    stream_post,
)

# The Triton call has no serialisation-compatibility guarantee (it is not a
# format to store); lowering is what these tests check.
TRITON_OK = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
PLATFORMS = [("tpu", "tpu", "tpu_custom_call"), ("gpu", "cuda", "__gpu$xla.gpu.triton")]
KERNEL_NAME = {
    "depth_attention": "attnres_depth_attention",
    "stream_post": "stream_post",
    "hc_pre": "hc_pre",
    "mhc_pre": "mhc_pre",
    "mhc_pre_liger": "mhc_pre",
}
N, T, D, N_SRC, STREAMS = 2, 100, 256, 9, 4  # 200 tokens: not a tile multiple
# The kernel unrolls its Sinkhorn loop: the paper's 20 iterations lower the same
# primitives and block shapes as 4, in a module five times the size (the eight
# mhc cases: 25.9 s with 20, 10.6 s with 4, one process on the 2-core VM).
SINKHORN_ITERS = 4


def spec(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def sum_outputs(fn):
    return lambda *a: sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(fn(*a)))


def kernels(backend, dtype):
    """name -> (function, argument specs, differentiable argnums)."""
    m = STREAMS * STREAMS + 2 * STREAMS
    h = spec((STREAMS, N, T, D), dtype)
    return {
        "depth_attention": (
            lambda v, valid, q, w: depth_attention(v, valid, q, w, 1e-6, backend),
            (spec((N_SRC, N, T, D), dtype), spec((N_SRC,), jnp.bool_), spec((D,)), spec((D,))),
            (0, 2, 3),
        ),
        "stream_post": (
            lambda *a: stream_post(*a, backend=backend),
            (h, spec((STREAMS, N, T, STREAMS)), spec((STREAMS, N, T)), spec((N, T, D), dtype)),
            (0, 1, 2, 3),
        ),
        "hc_pre": (
            lambda *a: hc_pre(*a, use_tanh=True, backend=backend),
            (h, spec((D, STREAMS + 2)), spec((STREAMS, STREAMS + 2)), spec((STREAMS + 2,))),
            (0, 1, 2, 3),
        ),
        "mhc_pre": (
            lambda *a: mhc_pre(*a, iters=SINKHORN_ITERS, temperature=1.0, eps=1e-6,
                               backend=backend),
            (h, spec((STREAMS, D, m)), spec((m,)), spec((m,))),
            (0, 1, 2, 3),
        ),
        # Liger's form (the default mhc: linear Sinkhorn, R[out, in], bf16 phi), with tanh.
        "mhc_pre_liger": (
            lambda *a: mhc_pre(*a, iters=SINKHORN_ITERS, temperature=1.0, eps=1e-6,
                               sinkhorn="linear", sinkhorn_eps=1e-6, layout="out_in",
                               use_tanh=True, backend=backend),
            (h, spec((STREAMS, D, m), jnp.bfloat16), spec((m,)), spec((m,))),
            (0, 1, 2, 3),
        ),
    }


def lower(fn, args, platform):
    exported = export.export(jax.jit(fn), platforms=[platform], disabled_checks=TRITON_OK)(*args)
    return exported.mlir_module()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(KERNEL_NAME))
@pytest.mark.parametrize("backend, platform, call", PLATFORMS, ids=["tpu", "cuda"])
def test_kernel_lowers_forward_and_backward(backend, platform, call, name, dtype):
    fn, args, argnums = kernels(backend, dtype)[name]
    forward = lower(fn, args, platform)
    assert call in forward and f"{KERNEL_NAME[name]}_fwd" in forward
    backward = lower(jax.grad(sum_outputs(fn), argnums=argnums), args, platform)
    assert f"{KERNEL_NAME[name]}_bwd" in backward, "the backward runs its own kernel"


@pytest.mark.parametrize("backend, platform, call", PLATFORMS, ids=["tpu", "cuda"])
def test_prefill_kernel_lowers(backend, platform, call):
    fn = lambda v, valid, q, w: completed_sources_attention(v, valid, q, w, 1e-6, backend)
    args = (
        spec((N_SRC, N, T, D), jnp.bfloat16),
        spec((N_SRC,), jnp.bool_),
        spec((4, D)),
        spec((4, D)),
    )
    module = lower(fn, args, platform)
    assert call in module and "attnres_completed_sources" in module


@pytest.mark.parametrize("name", ["depth_attention", "stream_post", "hc_pre", "mhc_pre"])
def test_identical_calls_share_one_lowered_kernel(name):
    """A model calls a kernel at the same shapes in every sublayer and again in the
    backward: identical calls are lowered once (backend.lowered_once), forward
    and backward, so a program holds one kernel per distinct call."""
    fn, args, argnums = kernels("tpu", jnp.float32)[name]
    twice = lambda *a: (fn(*a), fn(*a))
    for make in (lambda f: f, lambda f: jax.grad(sum_outputs(f), argnums=argnums)):
        once_module, twice_module = lower(make(fn), args, "tpu"), lower(make(twice), args, "tpu")
        assert once_module.count("tpu_custom_call") >= 1
        assert twice_module.count("tpu_custom_call") == once_module.count("tpu_custom_call")
