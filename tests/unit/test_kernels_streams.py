"""The fused HC/mHC routing kernels against their references (interpret mode, CPU).

``stream_post``, ``hc_pre`` and ``mhc_pre``: forward and gradients (streams,
sublayer output, every parameter) for n = 1, 2, 4 streams, odd token counts,
fp32 (tight) and bf16 (looser), under both backends' tiling rules; and the
kernels composed as the model uses them (pre -> sublayer -> post) equal the
model's own ``HC``/``MHC`` ``read`` and ``write``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_checks import BF16_TOL, FP32_TOL, assert_matches, rel_err
from noisy_params import normal

from depthbench.model.residual.hc import HC
from depthbench.model.residual.mhc import MHC
from depthbench.model.residual.protocol.base import Site
from depthbench.model.spec import ModelSpec
from depthbench.shapes import Shape
from pallas_kernels import (
    hc_operands,
    hc_pre,
    hc_pre_reference,
    mhc_operands,
    mhc_pre,
    mhc_pre_reference,
    stream_post,
    stream_post_reference,
)

SINKHORN = {"iters": 4, "temperature": 0.7, "eps": 1e-6}


# ---------------------------------------------------------------- post
@pytest.mark.parametrize(
    "backend, n, lead, d",
    [("interpret", 1, (7,), 16), ("interpret", 2, (3, 5), 32), ("interpret_gpu", 4, (13,), 24)],
)
def test_stream_post_fp32_matches_reference(backend, n, lead, d):
    args = jax.device_put((
        normal(0, (n, *lead, d)),
        normal(1, (n, *lead, n)),
        normal(2, (n, *lead)),
        normal(3, (*lead, d)),
    ))
    fused = lambda *a: stream_post(*a, backend=backend)
    assert_matches(fused, stream_post_reference, args, (0, 1, 2, 3), FP32_TOL)


def test_stream_post_bf16_matches_reference():
    n, lead, d = 4, (2, 9), 32
    args = jax.device_put((
        normal(0, (n, *lead, d), dtype=jnp.bfloat16),
        normal(1, (n, *lead, n)),
        normal(2, (n, *lead)),
        normal(3, (*lead, d), dtype=jnp.bfloat16),
    ))
    fused = lambda *a: stream_post(*a, backend="interpret")
    assert_matches(fused, stream_post_reference, args, (0, 1, 2, 3), BF16_TOL)


# ---------------------------------------------------------------- hc pre
def hc_args(n, lead, d, dtype=jnp.float32):
    return jax.device_put((
        normal(0, (n, *lead, d), dtype=dtype),
        normal(1, (d, n + 2), 0.3),
        normal(2, (n, n + 2)),
        1.0 + normal(3, (n + 2,), 0.2),
    ))


@pytest.mark.parametrize(
    "backend, n, lead, d, use_tanh",
    [
        ("interpret", 1, (7,), 16, True),
        ("interpret", 2, (3, 5), 32, False),
        ("interpret_gpu", 4, (13,), 24, True),
    ],
)
def test_hc_pre_fp32_matches_reference(backend, n, lead, d, use_tanh):
    fused = lambda *a: hc_pre(*a, use_tanh=use_tanh, backend=backend)
    ref = lambda *a: hc_pre_reference(*a, use_tanh)
    assert_matches(fused, ref, hc_args(n, lead, d), (0, 1, 2, 3), FP32_TOL)


def test_hc_pre_bf16_matches_reference():
    fused = lambda *a: hc_pre(*a, use_tanh=True, backend="interpret")
    ref = lambda *a: hc_pre_reference(*a, True)
    assert_matches(fused, ref, hc_args(4, (2, 9), 32, jnp.bfloat16), (0, 1, 2, 3), BF16_TOL)


# ---------------------------------------------------------------- mhc pre
def mhc_args(n, lead, d, dtype=jnp.float32):
    m = n * n + 2 * n
    return jax.device_put((
        normal(0, (n, *lead, d), dtype=dtype),
        normal(1, (n, d, m), 0.1),
        1.0 + normal(2, (m,), 0.2),
        normal(3, (m,)),
    ))


@pytest.mark.parametrize(
    "backend, n, lead, d",
    [("interpret", 1, (7,), 16), ("interpret", 2, (3, 5), 32), ("interpret_gpu", 4, (13,), 24)],
)
def test_mhc_pre_fp32_matches_reference(backend, n, lead, d):
    fused = lambda *a: mhc_pre(*a, backend=backend, **SINKHORN)
    ref = lambda *a: mhc_pre_reference(*a, n, **SINKHORN)
    assert_matches(fused, ref, mhc_args(n, lead, d), (0, 1, 2, 3), FP32_TOL)


def test_mhc_pre_bf16_matches_reference():
    fused = lambda *a: mhc_pre(*a, backend="interpret", **SINKHORN)
    ref = lambda *a: mhc_pre_reference(*a, 4, **SINKHORN)
    assert_matches(fused, ref, mhc_args(4, (2, 9), 32, jnp.bfloat16), (0, 1, 2, 3), BF16_TOL)


def test_mhc_pre_n1_sinkhorn_is_exactly_one():
    _, p, _ = jax.jit(lambda *a: mhc_pre(*a, backend="interpret", **SINKHORN))(
        *mhc_args(1, (5,), 16))
    np.testing.assert_array_equal(np.asarray(p), 1.0)


# ---------------------------------------------------------------- the model's routing
def family(cls, name, n, **fields):
    spec = ModelSpec.from_shape(Shape(2, 32, 64, 4, 2, 64), family=name)
    residual = dict(spec.residual)
    residual.update(hc_n=n, **fields)
    return cls(spec.replace(residual=tuple(sorted(residual.items()))))


def randomised(shapes, seed):
    """Random values for a connector pair's parameters (stacked over sub = 0, 1),
    drawn in numpy (in the names' order)."""
    rng = np.random.default_rng(seed)
    return jax.device_put({
        name: normal(rng, shape, 0.5)
        for name, shape in sorted(shapes.items())
    })


@pytest.mark.parametrize("sub", [0, 1])
def test_kernels_compose_to_the_models_hc_routing(sub):
    fam, n, d = family(HC, "hc", 4, hc_tanh=True), 4, 32
    p = randomised(
        {"A0": (2, n, n + 1), "beta0": (2, n), "W_a": (2, d, n + 1), "w_b": (2, d),
         "s_a": (2,), "s_b": (2,)},
        seed=sub,
    )  # fmt: skip
    h, y = jax.device_put((normal(5, (n, 2, 3, d)), normal(6, (2, 3, d))))

    @jax.jit  # one program (eagerly, interpret mode runs the kernel op by op)
    def model_and_kernels(p, h, y):
        site = Site(sub=sub, pos=jnp.int32(0), ident=jnp.int32(0))
        x_model, _ = fam.read(p, h, site)
        h_model = fam.write(p, h, y, site, {}, jnp.bool_(True))
        ops = hc_operands(*(p[k][sub] for k in ("A0", "beta0", "W_a", "w_b", "s_a", "s_b")))
        x, mix, beta = hc_pre(h, *ops, use_tanh=True, backend="interpret")
        return x_model, h_model, x, stream_post(h, mix, beta, y, backend="interpret")

    x_model, h_model, x, h_kernels = model_and_kernels(p, h, y)
    assert rel_err(x, x_model) < FP32_TOL
    assert rel_err(h_kernels, h_model) < FP32_TOL


@pytest.mark.parametrize("sub", [0, 1])
def test_kernels_compose_to_the_models_mhc_routing(sub):
    # mhc+pytorch's form (log-domain Sinkhorn, R[in, out]); Liger's, the default, and
    # tanh: test_kernels_mhc_liger.py.
    fam, n, d = family(MHC, "mhc", 4, sinkhorn_iters=5, sinkhorn_temperature=1.0,
                       mhc_sinkhorn="log", mhc_res_layout="in_out"), 4, 32
    p = randomised(
        {"phi": (2, n, d, n * n + 2 * n), "a_pre": (2,), "a_post": (2,), "a_res": (2,),
         "b_pre": (2, n), "b_post": (2, n), "B_res": (2, n, n)},
        seed=sub,
    )  # fmt: skip
    h, y = jax.device_put((normal(5, (n, 2, 3, d)), normal(6, (2, 3, d))))

    @jax.jit  # one program (eagerly, interpret mode runs the kernel op by op)
    def model_and_kernels(p, h, y):
        site = Site(sub=sub, pos=jnp.int32(0), ident=jnp.int32(0))
        x_model, _ = fam.read(p, h, site)
        h_model = fam.write(p, h, y, site, {}, jnp.bool_(True))
        names = ("phi", "a_pre", "a_post", "a_res", "b_pre", "b_post", "B_res")
        ops = mhc_operands(*(p[k][sub] for k in names))
        x, mix, post = mhc_pre(
            h, *ops, iters=5, temperature=1.0, eps=fam.cfg.mhc_rms_eps, backend="interpret"
        )
        return x_model, h_model, x, stream_post(h, mix, post, y, backend="interpret")

    x_model, h_model, x, h_kernels = model_and_kernels(p, h, y)
    assert rel_err(x, x_model) < FP32_TOL
    assert rel_err(h_kernels, h_model) < FP32_TOL
