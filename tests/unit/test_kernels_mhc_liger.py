"""The mHC pre-mix kernel in every mhc form, above all Liger's (the default).

``pallas_kernels.mhc_pre`` with its static options (``sinkhorn`` log |
linear with ``sinkhorn_eps``, ``layout`` in_out | out_in, ``use_tanh``)
against ``mhc_pre_reference`` in interpret mode: outputs and the gradients
of every input, fp32 to ``FP32_TOL``; a bf16 ``phi`` (Liger's storage) is
cast to fp32 before the product in both, so everything but ``phi``'s own
(bf16) gradient stays at fp32 tolerance.  Then the model's own ``MHC``
``read`` and ``write`` with ``model.impl = pallas`` (the kernels, through
``fused.mhc_pre``) equal ``impl = xla``, values and gradients, for the
default config: the reference computes what the model computes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_checks import (
    BF16_TOL,
    FAST_COMPILE,
    FP32_TOL,
    assert_matches,
    outputs_and_grads,
    rel_err,
)
from noisy_params import normal

from depthbench.model.residual.mhc import MHC
from depthbench.model.residual.protocol.base import Site
from depthbench.model.spec import ModelSpec
from depthbench.shapes import Shape
from pallas_kernels import mhc_pre, mhc_pre_reference

SINKHORN = {"iters": 4, "temperature": 0.7, "eps": 1e-6}
LIGER = {"sinkhorn": "linear", "sinkhorn_eps": 1e-6, "layout": "out_in", "use_tanh": False}


def mhc_args(n, lead, d, phi_dtype=jnp.float32):
    m = n * n + 2 * n
    return jax.device_put((
        normal(0, (n, *lead, d)),
        normal(1, (n, d, m), 0.1, phi_dtype),
        1.0 + normal(2, (m,), 0.2),
        normal(3, (m,)),
    ))


def pair(n, backend, form):
    fused = lambda *a: mhc_pre(*a, backend=backend, **SINKHORN, **form)
    ref = lambda *a: mhc_pre_reference(*a, n, **SINKHORN, **form)
    return fused, ref


@pytest.mark.parametrize(
    "backend, n, lead, d, form",
    [
        ("interpret", 4, (13,), 24, LIGER),
        # a large eps, so a misplaced one shows
        ("interpret_gpu", 4, (3, 5), 32, {**LIGER, "sinkhorn_eps": 1e-2, "use_tanh": True}),
        ("interpret", 2, (7,), 16, {**LIGER, "layout": "in_out"}),
        ("interpret", 4, (9,), 16, {"sinkhorn": "log", "layout": "out_in", "use_tanh": True}),
    ],
    ids=["liger", "liger_tanh_eps1e-2", "linear_in_out", "log_out_in_tanh"],
)
def test_mhc_pre_forms_match_reference(backend, n, lead, d, form):
    fused, ref = pair(n, backend, form)
    assert_matches(fused, ref, mhc_args(n, lead, d), (0, 1, 2, 3), FP32_TOL)


def test_mhc_pre_liger_bf16_phi():
    fused, ref = pair(4, "interpret", LIGER)
    args = mhc_args(4, (2, 9), 32, jnp.bfloat16)
    out_f, grad_f = outputs_and_grads(fused, args, (0, 1, 2, 3))
    out_r, grad_r = outputs_and_grads(ref, args, (0, 1, 2, 3))
    for a, b in zip(out_f, out_r, strict=True):  # phi is upcast exactly
        assert rel_err(a, b) < FP32_TOL
    for i, (a, b) in enumerate(zip(grad_f, grad_r, strict=True)):
        assert a.dtype == b.dtype == args[i].dtype
        assert rel_err(a, b) < (BF16_TOL if i == 1 else FP32_TOL), i  # dphi rounded to bf16


# ---------------------------------------------------------------- the model's routing
def mhc_family(impl, **fields):
    spec = ModelSpec.from_shape(Shape(2, 32, 64, 4, 2, 64), family="mhc")
    residual = dict(spec.residual)
    residual.update(hc_n=4, sinkhorn_iters=5, **fields)
    return MHC(spec.replace(residual=tuple(sorted(residual.items())), impl=impl))


def randomised(n, d, seed, phi_dtype):
    shapes = {"phi": (2, n, d, n * n + 2 * n), "a_pre": (2,), "a_post": (2,), "a_res": (2,),
              "b_pre": (2, n), "b_post": (2, n), "B_res": (2, n, n)}
    rng = np.random.default_rng(seed)  # numpy: no compiled program per shape
    return jax.device_put({name: normal(rng, shape, 0.5, phi_dtype if name == "phi" else np.float32)
                           for name, shape in sorted(shapes.items())})


def test_pallas_mhc_equals_xla_mhc_in_the_model():
    """``MHC.read`` + ``write`` (connector 1) with the kernels == with XLA, in the
    default (Liger) config: values and the gradients of the streams, the
    sublayer output and every parameter (phi bf16, as the default stores it).
    (tanh: the kernel tests above; measured here too, 8e-5 on phi's bf16 gradient.)"""
    xla, pallas = mhc_family("xla"), mhc_family("pallas")
    assert xla.cfg.mhc_sinkhorn == "linear" and xla.cfg.mhc_res_layout == "out_in"
    assert pallas._pallas() and not xla._pallas()
    n, d = 4, 32
    p = randomised(n, d, seed=0, phi_dtype=jnp.bfloat16)
    h, y = jax.device_put((normal(5, (n, 2, 3, d)), normal(6, (2, 3, d))))

    def run(fam):
        def f(p, h, y):
            site = Site(sub=1, pos=jnp.int32(0), ident=jnp.int32(0))
            x, _ = fam.read(p, h, site)
            new = fam.write(p, h, y, site, {}, jnp.bool_(True))
            return jnp.sum(x * jnp.cos(x)) + jnp.sum(new * jnp.sin(new)), (x, new)

        grad = jax.grad(f, argnums=(0, 1, 2), has_aux=True)
        return jax.jit(grad).lower(p, h, y).compile(compiler_options=FAST_COMPILE)(p, h, y)

    (g_p, g_h, g_y), (x_p, new_p) = run(pallas)
    (r_p, r_h, r_y), (x_r, new_r) = run(xla)
    assert rel_err(x_p, x_r) < FP32_TOL and rel_err(new_p, new_r) < FP32_TOL
    assert rel_err(g_h, r_h) < FP32_TOL and rel_err(g_y, r_y) < FP32_TOL
    for name in g_p:
        tol = BF16_TOL if g_p[name].dtype == jnp.bfloat16 else FP32_TOL
        assert rel_err(g_p[name], r_p[name]) < tol, name
