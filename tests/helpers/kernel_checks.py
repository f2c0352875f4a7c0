"""Shared helpers of the kernel tests: compare a fused kernel with its reference,
outputs and gradients (one ``jax.vjp`` each, a random cotangent), by the
largest error relative to the reference's largest magnitude.

Test inputs are drawn in numpy (``noisy_params.normal``) and put on the
device with ``jax.device_put``, and the errors are computed in numpy: each eager jax op outside
``jit`` compiles a small program per shape and dtype (``jax.random.normal``
about 35 ms on CPU, ``jnp.asarray`` of a numpy array a copy program), the
pattern of ``noisy_params.py``."""

import jax
import jax.numpy as jnp
import numpy as np

FP32_TOL = 2e-5
BF16_TOL = 3e-2


def rel_err(a, b, floor: float = 1e-30) -> float:
    """max |a - b| relative to max |b| (``a`` finite, the shapes equal)."""
    a = np.asarray(a, np.float32)  # bf16 to fp32 is exact
    b = np.asarray(b, np.float32)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.all(np.isfinite(a)), "non-finite values in the output compared"
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), floor))


# XLA's lowest CPU optimisation level compiles the interpreted kernels several
# times faster; fused and reference are compared at the same level.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def outputs_and_grads(fn, args, argnums, seed=0):
    """``fn``'s outputs and the gradients of ``<outputs, cotangent>`` w.r.t.
    ``argnums`` (a random cotangent), in one program compiled with ``FAST_COMPILE``."""

    def run(*diff):
        def part(*d):
            full = list(args)
            for i, x in zip(argnums, d, strict=True):
                full[i] = x
            return fn(*full)

        out, pullback = jax.vjp(part, *diff)
        leaves, tree = jax.tree.flatten(out)
        keys = jax.random.split(jax.random.key(seed), len(leaves))
        cot = [
            jax.random.normal(k, x.shape, jnp.float32).astype(x.dtype)
            for k, x in zip(keys, leaves, strict=True)
        ]
        return leaves, pullback(jax.tree.unflatten(tree, cot))

    diff = [args[i] for i in argnums]
    return jax.jit(run).lower(*diff).compile(compiler_options=FAST_COMPILE)(*diff)


def assert_matches(fused, reference, args, argnums, tol, floor: float = 1e-30):
    """Fused and reference agree in every output and every gradient to ``tol``,
    relative to the reference's largest magnitude (at least ``floor``: where a
    gradient is zero in exact arithmetic, the kernel's rounding is compared
    with ``floor``)."""
    out_f, grad_f = outputs_and_grads(fused, args, argnums)
    out_r, grad_r = outputs_and_grads(reference, args, argnums)
    for i, (a, b) in enumerate(zip(out_f, out_r, strict=True)):
        assert a.dtype == b.dtype, f"output {i}: dtype {a.dtype} vs {b.dtype}"
        assert rel_err(a, b) < tol, f"output {i}: rel err {rel_err(a, b):.2e}"
    for i, (a, b) in zip(argnums, zip(grad_f, grad_r, strict=True), strict=True):
        assert a.dtype == b.dtype, f"grad of arg {i}: dtype {a.dtype} vs {b.dtype}"
        err = rel_err(a, b, floor)
        assert err < tol, f"grad of arg {i}: rel err {err:.2e}"
