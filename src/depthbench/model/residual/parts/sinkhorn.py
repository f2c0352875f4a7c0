"""Sinkhorn-Knopp: project ``exp(R / tau)`` onto doubly-stochastic matrices, two ways.

mHC (spec/residuals.md, family 7) mixes its ``n`` residual streams with a
matrix ``P = sinkhorn(R)`` whose rows and columns each sum to 1, so the
mixing neither amplifies nor drains the streams however deep the model.
The original benchmark trained it in two forms, which differ after a
finite number of rounds:

* :func:`sinkhorn` (``mhc_sinkhorn = "log"``, its PyTorch mHC:
  ``hyper_connections.py`` ``sinkhorn_log``): log-sum-exps subtracted in the
  log domain, finite for any logits, including mHC's ``-8`` initial
  off-diagonal biases and large learned gates;
* :func:`sinkhorn_linear` (``"linear"``, its Liger mHC, the 400M runs:
  liger-kernel 0.8.5 ``ops/mhc.py``, ``_mhc_split_sinkhorn_fwd_kernel``): a
  row softmax, then divisions by the column and row sums each plus ``eps``.

Both normalise the last axis first and end on the second-to-last.  Pure
``jnp`` in fp32, so a fused kernel can replace them (both forms:
``pallas_kernels.sinkhorn_tile``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from depthbench.model.residual.protocol.base import axis_max, axis_sum, keep_for_backward


def sinkhorn(logits: jax.Array, iters: int, temperature: float = 1.0) -> jax.Array:
    """Doubly-stochastic ``P`` from ``logits`` ``[..., n, n]`` (fp32 out).

    Each of the ``iters`` iterations normalises the rows (last axis), then
    the columns (second-to-last axis), in the log domain.  The last step is a
    column normalisation, so columns sum to 1 to rounding and rows to within
    the iteration's convergence (1e-5 after 20 iterations for logits of
    order one; mHC's near-identity start converges in one).  ``n = 1`` gives
    exactly ``[[1.]]``.
    """
    log_p = logits.astype(jnp.float32) / jnp.float32(temperature)

    def normalise(_, lp):
        return _log_normalise(_log_normalise(lp, -1), -2)

    # The last column normalisation and the exp as one softmax, whose backward
    # needs only its output: the loop's result is then needed by nothing in
    # the backward, which under matmuls_saveable would otherwise rerun it.
    log_p = jax.lax.fori_loop(0, int(iters) - 1, normalise, log_p)
    return _softmax(_log_normalise(log_p, -1), -2)


def sinkhorn_linear(logits: jax.Array, iters: int, eps: float,
                    temperature: float = 1.0) -> jax.Array:
    """Doubly-stochastic ``P`` from ``logits`` ``[..., n, n]`` in the linear domain
    (fp32 out), as Liger's mHC kernel computes it::

        P = softmax(R / tau, last axis) + eps
        P = P / (sum(P, second-to-last axis) + eps)
        repeat iters - 1 times:
            P = P / (sum(P, last axis) + eps);  P = P / (sum(P, second-to-last) + eps)

    ``eps`` keeps every sum away from 0 (Liger's ``sinkhorn_eps``, 1e-6), so the
    rows and columns sum to 1 only to within about ``n eps``.

    Differentiated by hand (:func:`_linear_bwd`): the forward keeps each
    iteration's input, the backward runs the iterations in reverse, one loop
    step each, recomputing an iteration's two normalisations from its input.
    Autodiff of the loop took twice as long on CPU: its backward turned every
    broadcast sum into a reduction of its own (bench/results/depth_memory.md,
    "the deep-narrow step")."""
    return _linear(logits.astype(jnp.float32) / jnp.float32(temperature), int(iters), float(eps))


def _normalised(q: jax.Array, axis: int, eps: float) -> tuple[jax.Array, jax.Array]:
    """``q / (sum(q, axis) + eps)`` and that denominator."""
    den = axis_sum(q, axis) + eps
    return q / den, den


def _normalised_bwd(g: jax.Array, out: jax.Array, den: jax.Array, axis: int) -> jax.Array:
    """The cotangent of :func:`_normalised`'s input from its output's ``g``:
    ``(g - sum(g out, axis)) / den``."""
    return (g - axis_sum(g * out, axis)) / den


def _iteration(q: jax.Array, eps: float):
    """One round: the rows, then the columns; both outputs and denominators."""
    rows, den_rows = _normalised(q, -1, eps)
    cols, den_cols = _normalised(rows, -2, eps)
    return rows, den_rows, cols, den_cols


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _linear(x: jax.Array, iters: int, eps: float) -> jax.Array:
    return _linear_fwd(x, iters, eps)[0]


def _linear_fwd(x, iters, eps):
    p0 = jnp.exp(x - _logsumexp(x, -1))
    q, _ = _normalised(p0 + eps, -2, eps)

    def body(q, _):
        return _iteration(q, eps)[2], q

    out, inputs = jax.lax.scan(body, q, None, length=iters - 1)
    return out, (p0, inputs)


def _linear_bwd(iters, eps, res, g):
    p0, inputs = res

    def body(g, q):
        rows, den_rows, cols, den_cols = _iteration(q, eps)
        return _normalised_bwd(_normalised_bwd(g, cols, den_cols, -2), rows, den_rows, -1), None

    g, _ = jax.lax.scan(body, g, inputs, reverse=True)
    q, den = _normalised(p0 + eps, -2, eps)
    g = _normalised_bwd(g, q, den, -2)
    return (p0 * (g - axis_sum(g * p0, -1)),)


_linear.defvjp(_linear_fwd, _linear_bwd)


def sinkhorn_flops(n: int, iters: int, linear: bool = False) -> int:
    """FLOPs of :func:`sinkhorn` per matrix, counted as 3 per entry per
    normalisation (an exp, an add into the log-sum, a subtract; the log of the
    ``n`` sums is negligible), two normalisations per iteration; of
    :func:`sinkhorn_linear` (``linear``), 2 per entry per normalisation (an add
    into the sum, a divide), the first row's softmax counted as one (3)."""
    if linear:
        return 2 * 2 * n * n * int(iters) + n * n
    return 2 * 3 * n * n * int(iters)


def _logsumexp(x: jax.Array, axis: int) -> jax.Array:
    # (sums and maxima over the n-long axis as chains: base.axis_sum)
    mu = axis_max(x, axis)
    return mu + jnp.log(axis_sum(jnp.exp(x - mu), axis))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _log_normalise(lp: jax.Array, axis: int) -> jax.Array:
    """``lp - logsumexp(lp, axis)``, differentiated from its output alone:
    ``d lp = g - e^out sum(g, axis)`` (``e^out`` is the softmax).  The output is
    kept under ``matmuls_saveable``, so the backward reruns no iteration."""
    return lp - _logsumexp(lp, axis)


def _log_normalise_fwd(lp, axis):
    out = keep_for_backward(_log_normalise(lp, axis))
    return out, out


def _log_normalise_bwd(axis, out, g):
    return (g - jnp.exp(out) * axis_sum(g, axis),)


_log_normalise.defvjp(_log_normalise_fwd, _log_normalise_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _softmax(x: jax.Array, axis: int) -> jax.Array:
    """``softmax(x, axis)``, differentiated from its output ``p`` alone (kept under
    ``matmuls_saveable``): ``d x = p (g - sum(g p, axis))``."""
    return jnp.exp(x - _logsumexp(x, axis))


def _softmax_fwd(x, axis):
    p = keep_for_backward(_softmax(x, axis))
    return p, p


def _softmax_bwd(axis, p, g):
    return (p * (g - axis_sum(g * p, axis)),)


_softmax.defvjp(_softmax_fwd, _softmax_bwd)
