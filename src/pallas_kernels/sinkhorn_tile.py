"""Sinkhorn inside a kernel, log or linear domain, forward and backward, on a token tile.

The ``n x n`` matrices of a tile are held densely: ``L`` is ``[tile, K]``
(``entry_axis = 1``) or ``[K, tile]`` (``entry_axis = 0``), entry ``k = s*n + t``
being row ``s``, column ``t`` of each token's matrix; entries ``k >= n*n``
(padding to the backend's lane width) belong to no row or column and are
ignored (0 in ``P``).  The iterations are exactly those of
``depthbench.model.residual.parts.sinkhorn``.  "Rows" normalise over ``t``
(the last axis), "columns" over ``s``.

Log domain (``sinkhorn``, mHC's PyTorch form)::

    L <- R / tau;  repeat iters: L <- L - lse_t(L) (rows); L <- L - lse_s(L) (cols)
    P = exp(L)

Backward of one normalisation ``o = x - lse(x)`` over a group:
``dx = do - exp(o) * sum_group(do)`` (``exp(o)`` is the group's softmax), so
the backward needs each step's *output*.

Linear domain (``sinkhorn_linear``, Liger's mHC, with ``eps > 0``)::

    S = softmax_t(R / tau);  Q = S + eps;  Q <- Q / (sum_s Q + eps)   (cols)
    repeat iters - 1:  Q <- Q / (sum_t Q + eps) (rows);  Q <- Q / (sum_s Q + eps) (cols)
    P = Q

Backward of one division ``o = x / D``, ``D = sum_group(x) + eps``:
``dx = (do - sum_group(do * o)) / D`` (``eps`` is a constant, so it only
enters through ``D``); of the softmax: ``dR = S (dS - sum_t(dS S)) / tau``.
The backward needs each division's *input* (``D`` and ``o`` are recomputed
from it) and ``S``.  With ``iters = 1`` the linear form is one column
division; for ``n = 1`` its ``P`` is 1 only to within about ``eps``.

Either way the backward kernel recomputes the whole forward on chip (from
``R``) and keeps the ``2 * iters`` step values as values; nothing of
Sinkhorn's is saved to memory between the passes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

KINDS = ("log", "linear")


def _entries(shape, entry_axis: int) -> jax.Array:
    return jax.lax.broadcasted_iota(jnp.int32, shape, entry_axis)


def _member(k: jax.Array, n: int, g: int, by_row: bool) -> jax.Array:
    """Entries of row ``g`` (``by_row``) or column ``g``.  ``lax.div``/``rem``
    rather than ``//``/``%``: ``k >= 0``, and jnp's floor division lowers through
    ``sign``, whose Mosaic rule needs a live TPU to query its generation."""
    if by_row:
        return jax.lax.div(k, jnp.int32(n)) == g
    return (jax.lax.rem(k, jnp.int32(n)) == g) & (k < n * n)


def _group_sum(x: jax.Array, member: jax.Array, entry_axis: int) -> jax.Array:
    """Sum of the members of one group, broadcast along the entry axis."""
    return jnp.sum(jnp.where(member, x, 0.0), axis=entry_axis, keepdims=True)


def _group_lse(x: jax.Array, member: jax.Array, entry_axis: int) -> jax.Array:
    """``logsumexp`` of the members of one group, broadcast along the entry axis."""
    m = jnp.max(jnp.where(member, x, -jnp.inf), axis=entry_axis, keepdims=True)
    return m + jnp.log(_group_sum(jnp.exp(x - m), member, entry_axis))


# ---------------------------------------------------------------- log domain
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
        dx = jnp.where(member, do - jnp.exp(o) * _group_sum(do, member, entry_axis), dx)
    return dx


# ---------------------------------------------------------------- linear domain
def _divide(x, n: int, by_row: bool, entry_axis: int, eps: float):
    k = _entries(x.shape, entry_axis)
    out = x
    for g in range(n):
        member = _member(k, n, g, by_row)
        out = jnp.where(member, x / (_group_sum(x, member, entry_axis) + eps), out)
    return out


def _divide_bwd(x, do, n: int, by_row: bool, entry_axis: int, eps: float):
    k = _entries(x.shape, entry_axis)
    dx = do
    for g in range(n):
        member = _member(k, n, g, by_row)
        denom = _group_sum(x, member, entry_axis) + eps
        back = _group_sum(do * (x / denom), member, entry_axis)
        dx = jnp.where(member, (do - back) / denom, dx)
    return dx


def _softmax_rows_bwd(s, ds, n: int, entry_axis: int):
    k = _entries(s.shape, entry_axis)
    dx = jnp.zeros_like(ds)
    for g in range(n):
        member = _member(k, n, g, True)
        dx = jnp.where(member, s * (ds - _group_sum(ds * s, member, entry_axis)), dx)
    return dx


# ---------------------------------------------------------------- entry points
def sinkhorn_tile(r, n: int, iters: int, temperature: float, entry_axis: int,
                  kind: str = "log", eps: float = 0.0):
    """``(P, steps)``: ``P`` after ``iters`` rounds of the ``kind`` iteration
    (``log`` or ``linear`` with ``eps``) and the values the backward needs
    (for :func:`sinkhorn_tile_bwd`).  Padded entries of ``P`` are 0."""
    x = r / jnp.float32(temperature)
    valid = _entries(x.shape, entry_axis) < n * n
    steps = []
    if kind == "linear":
        soft = jnp.where(valid, jnp.exp(_normalise(x, n, True, entry_axis)), 0.0)
        q = jnp.where(valid, soft + jnp.float32(eps), 0.0)
        steps.append(soft)
        for i in range(2 * int(iters) - 1):  # columns first, then rows, columns, ...
            steps.append(q)
            q = _divide(q, n, i % 2 == 1, entry_axis, eps)
        return q, steps
    for _ in range(int(iters)):
        x = _normalise(x, n, True, entry_axis)
        steps.append(x)
        x = _normalise(x, n, False, entry_axis)
        steps.append(x)
    return jnp.where(valid, jnp.exp(x), 0.0), steps


def sinkhorn_tile_bwd(p, steps, dp, n: int, temperature: float, entry_axis: int,
                      kind: str = "log", eps: float = 0.0):
    """``dR`` from ``dP`` (reverse of :func:`sinkhorn_tile`, same ``kind``);
    ``dP`` must be 0 in the padded entries."""
    if kind == "linear":
        soft, inputs = steps[0], steps[1:]
        dq = dp
        for i in range(len(inputs) - 1, -1, -1):
            dq = _divide_bwd(inputs[i], dq, n, i % 2 == 1, entry_axis, eps)
        return _softmax_rows_bwd(soft, dq, n, entry_axis) / jnp.float32(temperature)
    dx = dp * p
    for i in range(len(steps) - 1, -1, -1):
        dx = _normalise_bwd(steps[i], dx, n, by_row=(i % 2 == 0), entry_axis=entry_axis)
    return dx / jnp.float32(temperature)
