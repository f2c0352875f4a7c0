"""Log-domain Sinkhorn-Knopp: project ``exp(R / tau)`` onto doubly-stochastic matrices.

mHC (spec/residuals.md, family 7) mixes its ``n`` residual streams with a
matrix ``P = sinkhorn(R)`` whose rows and columns each sum to 1, so the
mixing neither amplifies nor drains the streams however deep the model.
Working with ``log P`` (subtracting log-sum-exps) instead of dividing
``exp(R)`` by its sums keeps the iteration finite for any logits, including
mHC's ``-8`` initial off-diagonal biases and large learned gates.

Pure ``jnp`` in fp32, so a fused kernel can replace it (``pallas_kernels``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
        lp = lp - jax.nn.logsumexp(lp, axis=-1, keepdims=True)
        return lp - jax.nn.logsumexp(lp, axis=-2, keepdims=True)

    log_p = jax.lax.fori_loop(0, int(iters), normalise, log_p)
    return jnp.exp(log_p)


def sinkhorn_flops(n: int, iters: int) -> int:
    """FLOPs of :func:`sinkhorn` per matrix, counted as 3 per entry per
    normalisation (an exp, an add into the log-sum, a subtract; the log of the
    ``n`` sums is negligible), two normalisations per iteration."""
    return 2 * 3 * n * n * int(iters)
