"""HC/mHC post-mix: write a sublayer output into ``n`` residual streams.

Per token, for target stream ``t``::

    H'[t] = sum_s P[s, t] H[s] + b[t] y                  (fp32, out in H's dtype)

exactly ``add_weighted(mix_streams(P, H), b, y)`` of
``depthbench.model.residual.parts.streams`` (hc: ``P = A[:, 1:]``, ``b = beta``;
mhc: ``P = sinkhorn(R)``, ``b = post``), summed in the same order.  The
kernel reads ``H`` and ``y`` once and writes ``H'`` once per token tile.

Backward (``jax.custom_vjp``), with ``G[t] = dL/dH'[t]``::

    dH[s]   = sum_t P[s, t] G[t]          dP[s, t] = G[t] . H[s]
    dy      = sum_t b[t] G[t]             db[t]    = G[t] . y

Coefficients travel token-major (``P`` as ``[N, n*n]``, ``b`` as ``[N, n]``,
lanes padded to the target's width), the layout :mod:`stream_pre` emits;
:func:`stream_post` takes the model's layout (``P[s, ..., t]``, ``b[t, ...]``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.backend import Target, column, lowered_once, pad_axis, place, resolve, round_up


def stream_post_reference(h_snd, p_snt, b_tn, y_nd):
    """``add_weighted(mix_streams(P, H), b, y)`` in H's dtype (the XLA path)."""
    h32 = h_snd.astype(jnp.float32)
    c = jnp.moveaxis(p_snt.astype(jnp.float32), -1, 1)[..., None]  # [s, t, N, 1]
    out = c[0] * h32[0][None]
    for s in range(1, h_snd.shape[0]):
        out = out + c[s] * h32[s][None]
    out = out + b_tn.astype(jnp.float32)[..., None] * y_nd.astype(jnp.float32)[None]
    return out.astype(h_snd.dtype)


# ---------------------------------------------------------------- kernels
def _fwd_kernel(p_ref, b_ref, h_ref, y_ref, out_ref):
    n = h_ref.shape[0]
    p_tk, b_tk = p_ref[...], b_ref[...]
    y = y_ref[...].astype(jnp.float32)
    for t in range(n):
        acc = column(p_tk, t) * h_ref[0].astype(jnp.float32)
        for s in range(1, n):
            acc = acc + column(p_tk, s * n + t) * h_ref[s].astype(jnp.float32)
        out_ref[t] = (acc + column(b_tk, t) * y).astype(out_ref.dtype)


def _bwd_kernel(p_ref, b_ref, h_ref, y_ref, g_ref, dh_ref, dy_ref, dp_ref, db_ref):
    n = h_ref.shape[0]
    p_tk, b_tk = p_ref[...], b_ref[...]
    y = y_ref[...].astype(jnp.float32)
    dp_cols = [None] * (n * n)
    for s in range(n):
        h_s = h_ref[s].astype(jnp.float32)
        dh = None
        for t in range(n):
            g_t = g_ref[t].astype(jnp.float32)
            term = column(p_tk, s * n + t) * g_t
            dh = term if dh is None else dh + term
            dp_cols[s * n + t] = jnp.sum(h_s * g_t, axis=1, keepdims=True)
        dh_ref[s] = dh.astype(dh_ref.dtype)
    dy, db_cols = None, []
    for t in range(n):
        g_t = g_ref[t].astype(jnp.float32)
        term = column(b_tk, t) * g_t
        dy = term if dy is None else dy + term
        db_cols.append(jnp.sum(y * g_t, axis=1, keepdims=True))
    dy_ref[...] = dy.astype(dy_ref.dtype)
    dp_ref[...] = place(dp_cols, dp_ref.shape[1])
    db_ref[...] = place(db_cols, db_ref.shape[1])


# ---------------------------------------------------------------- pallas calls
def _specs(n: int, tile: int, width: int, p_lanes: int, b_lanes: int):
    return {
        "p": pl.BlockSpec((tile, p_lanes), lambda i: (i, 0)),
        "b": pl.BlockSpec((tile, b_lanes), lambda i: (i, 0)),
        "h": pl.BlockSpec((n, tile, width), lambda i: (0, i, 0)),
        "y": pl.BlockSpec((tile, width), lambda i: (i, 0)),
    }


def _fwd_call(p_tk, b_tk, h_snd, y_nd, tile, target):
    n, n_tok, width = h_snd.shape
    sp = _specs(n, tile, width, p_tk.shape[1], b_tk.shape[1])
    return target.pallas_call(
        _fwd_kernel,
        grid=(n_tok // tile,),
        in_specs=[sp["p"], sp["b"], sp["h"], sp["y"]],
        out_specs=sp["h"],
        out_shape=jax.ShapeDtypeStruct(h_snd.shape, h_snd.dtype),
        name="stream_post_fwd",
    )(p_tk, b_tk, h_snd, y_nd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def stream_post_tokens(p_tk, b_tk, h_snd, y_nd, tile: int, target: Target):
    """Kernel-level entry: padded token-major coefficients, ``H[n, Np, w]``,
    ``y[Np, w]`` with ``Np`` a multiple of ``tile``."""
    return _fwd_call(p_tk, b_tk, h_snd, y_nd, tile, target)


def _vjp_fwd(p_tk, b_tk, h_snd, y_nd, tile, target):
    return _fwd_call(p_tk, b_tk, h_snd, y_nd, tile, target), (p_tk, b_tk, h_snd, y_nd)


def _vjp_bwd(tile, target, res, g_snd):
    p_tk, b_tk, h_snd, y_nd = res
    n, n_tok, width = h_snd.shape
    sp = _specs(n, tile, width, p_tk.shape[1], b_tk.shape[1])
    dh, dy, dp, db = target.pallas_call(
        _bwd_kernel,
        grid=(n_tok // tile,),
        in_specs=[sp["p"], sp["b"], sp["h"], sp["y"], sp["h"]],
        out_specs=[sp["h"], sp["y"], sp["p"], sp["b"]],
        out_shape=[
            jax.ShapeDtypeStruct(h_snd.shape, h_snd.dtype),
            jax.ShapeDtypeStruct(y_nd.shape, y_nd.dtype),
            jax.ShapeDtypeStruct(p_tk.shape, jnp.float32),
            jax.ShapeDtypeStruct(b_tk.shape, jnp.float32),
        ],
        name="stream_post_bwd",
    )(p_tk, b_tk, h_snd, y_nd, g_snd)
    return dp, db, dh, dy


stream_post_tokens.defvjp(_vjp_fwd, _vjp_bwd)
_stream_post_entry = lowered_once(stream_post_tokens)


def post_tile(target: Target, n: int, n_tok: int, width: int, itemsize: int) -> int:
    """TPU: ``H``, ``H'`` (and backward ``G``, ``dH``) blocks double-buffered in VMEM;
    Triton: a few ``[tile, d]`` fp32 arrays live."""
    if target.kind == "tpu":
        per_token = 2 * (4 * n + 2) * width * itemsize + 4 * width * 4
    else:
        per_token = 4 * width * 4
    return target.token_tile(n_tok, per_token)


def stream_post(h_snd, p_snt, b_tn, y_nd, backend: str | Target | None = "auto"):
    """Fused :func:`stream_post_reference`; model layout in and out
    (``H[n, ..., d]``, ``P[n, ..., n]``, ``b[n, ...]``, ``y[..., d]``)."""
    target = resolve(backend)
    n, *lead, d = h_snd.shape
    n_tok = 1
    for size in lead:
        n_tok *= size
    width = target.width(d)
    tile = post_tile(target, n, n_tok, width, h_snd.dtype.itemsize)
    n_pad = round_up(n_tok, tile)
    p_tk = jnp.moveaxis(p_snt.reshape(n, n_tok, n).astype(jnp.float32), 1, 0).reshape(n_tok, n * n)
    b_tk = b_tn.reshape(n, n_tok).astype(jnp.float32).T
    p_tk = pad_axis(pad_axis(p_tk, 0, n_pad), 1, target.width(n * n))
    b_tk = pad_axis(pad_axis(b_tk, 0, n_pad), 1, target.width(n))
    h = pad_axis(pad_axis(h_snd.reshape(n, n_tok, d), 1, n_pad), 2, width)
    y = pad_axis(pad_axis(y_nd.reshape(n_tok, d), 0, n_pad), 1, width)
    out = _stream_post_entry(p_tk, b_tk, h, y, tile, target)
    return out[:, :n_tok, :d].reshape(h_snd.shape)
