"""Log-domain Sinkhorn inside a kernel, forward and backward, on a token tile.

The ``n x n`` matrices of a tile are held densely: ``L`` is ``[tile, K]``
(``entry_axis = 1``) or ``[K, tile]`` (``entry_axis = 0``), entry ``k = s*n + t``
being row ``s``, column ``t`` of each token's matrix; entries ``k >= n*n``
(padding to the backend's lane width) belong to no row or column and are
ignored.  The iteration is exactly ``depthbench.model.residual.parts.sinkhorn``::

    L <- R / tau;  repeat iters: L <- L - lse_t(L) (rows); L <- L - lse_s(L) (cols)
    P = exp(L)

Backward of one normalisation ``o = x - lse(x)`` over a group:
``dx = do - exp(o) * sum_group(do)`` (``exp(o)`` is the group's softmax), so
the backward needs each step's *output*.  The backward kernel recomputes the
whole forward on chip (from ``R``) and keeps the ``2 * iters`` step outputs
as values; nothing of Sinkhorn's is saved to memory between the passes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _entries(shape, entry_axis: int) -> jax.Array:
    return jax.lax.broadcasted_iota(jnp.int32, shape, entry_axis)


def _member(k: jax.Array, n: int, g: int, by_row: bool) -> jax.Array:
    """Entries of row ``g`` (``by_row``) or column ``g``.  ``lax.div``/``rem``
    rather than ``//``/``%``: ``k >= 0``, and jnp's floor division lowers through
    ``sign``, whose Mosaic rule needs a live TPU to query its generation."""
    if by_row:
        return jax.lax.div(k, jnp.int32(n)) == g
    return (jax.lax.rem(k, jnp.int32(n)) == g) & (k < n * n)


def _group_lse(x: jax.Array, member: jax.Array, entry_axis: int) -> jax.Array:
    """``logsumexp`` of the members of one group, broadcast along the entry axis."""
    m = jnp.max(jnp.where(member, x, -jnp.inf), axis=entry_axis, keepdims=True)
    total = jnp.sum(jnp.where(member, jnp.exp(x - m), 0.0), axis=entry_axis, keepdims=True)
    return m + jnp.log(total)


def _normalise(x, n: int, by_row: bool, entry_axis: int):
    k = _entries(x.shape, entry_axis)
    out = x
    for g in range(n):
        member = _member(k, n, g, by_row)
        out = jnp.where(member, x - _group_lse(x, member, entry_axis), out)
    return out


def _normalise_bwd(o, do, n: int, by_row: bool, entry_axis: int):
    k = _entries(o.shape, entry_axis)
    dx = do
    for g in range(n):
        member = _member(k, n, g, by_row)
        group_sum = jnp.sum(jnp.where(member, do, 0.0), axis=entry_axis, keepdims=True)
        dx = jnp.where(member, do - jnp.exp(o) * group_sum, dx)
    return dx


def sinkhorn_tile(r, n: int, iters: int, temperature: float, entry_axis: int):
    """``(P, steps)``: ``P = exp(L)`` after ``iters`` row-then-column normalisations
    and the list of every normalisation's output (for :func:`sinkhorn_tile_bwd`).
    Padded entries of ``P`` are 0."""
    x = r / jnp.float32(temperature)
    steps = []
    for _ in range(int(iters)):
        x = _normalise(x, n, True, entry_axis)
        steps.append(x)
        x = _normalise(x, n, False, entry_axis)
        steps.append(x)
    valid = _entries(x.shape, entry_axis) < n * n
    return jnp.where(valid, jnp.exp(x), 0.0), steps


def sinkhorn_tile_bwd(p, steps, dp, n: int, temperature: float, entry_axis: int):
    """``dR`` from ``dP`` (reverse of :func:`sinkhorn_tile`)."""
    dx = dp * p
    for i in range(len(steps) - 1, -1, -1):
        dx = _normalise_bwd(steps[i], dx, n, by_row=(i % 2 == 0), entry_axis=entry_axis)
    return dx / jnp.float32(temperature)
