"""HC pre-mix: dynamic hyper-connection coefficients and the sublayer input.

Per token, for streams ``H[s]`` (``s < n``), exactly ``HC.coefficients`` and
``HC.read`` of ``depthbench.model.residual.hc``::

    r[s]    = rsqrt(mean_d H[s]^2 + 1e-8)                       (fp32, no weight)
    a[s]    = act((r[s] H[s]) @ W)        W = [W_a | w_b]: d x (n + 2), act = tanh or id
    c[s]    = base[s] + scale * a[s]      base[s] = [A0[s, :] | beta0[s]]
                                          scale   = [s_a]*(n+1) + [s_b]
    x       = sum_s c[s, 0] H[s]                                 (H's dtype)
    P[s, t] = c[s, 1 + t];   beta[s] = c[s, n + 1]

Outputs ``x``, ``P`` and ``beta`` (token-major, what :mod:`stream_post`
takes).  Backward (``jax.custom_vjp``): the kernel recomputes the forward
from ``H``, then with ``dc[s] = [dx . H[s] | dP[s, :] | dbeta[s]]``::

    d(base)[s] = sum_tok dc[s];  d(scale) = sum_tok sum_s dc[s] a[s]
    dq[s]      = dc[s] scale act'          dW = sum_tok sum_s H[s]^T (r[s] dq[s])  (XLA)
    dhn[s]     = dq[s] @ W^T
    dH[s]      = c[s, 0] dx + r[s] dhn[s] - r[s]^3 H[s] (dhn[s] . H[s]) / d

``d(base)``, ``d(scale)`` come back as one partial sum per token tile;
``dW`` as the per-token ``r[s] dq[s]`` that XLA contracts with ``H``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.backend import column, lowered_once, pad_axis, place, resolve, round_up
from pallas_kernels.mhc_pre import _NT, pre_tile

HC_EPS = 1e-8  # the stream norm's eps (hc.HC_EPS)


def _stream(h_ref, w, base_ref, scale, s, *, d_true, use_tanh):
    h = h_ref[s].astype(jnp.float32)
    inv_rms = jax.lax.rsqrt(jnp.sum(h * h, axis=1, keepdims=True) / d_true + HC_EPS)
    hn = h * inv_rms
    act = jnp.dot(hn, w, preferred_element_type=jnp.float32)
    if use_tanh:
        act = jnp.tanh(act)
    coef = base_ref[pl.ds(s, 1), :] + scale * act
    return h, inv_rms, hn, act, coef


def _fwd_kernel(h_ref, w_ref, base_ref, scale_ref, x_ref, p_ref, b_ref, *, n, **static):
    w, scale = w_ref[...], scale_ref[...]
    x, p_cols, b_cols = None, [], []
    for s in range(n):
        h, _, _, _, coef = _stream(h_ref, w, base_ref, scale, s, **static)
        term = column(coef, 0) * h
        x = term if x is None else x + term
        p_cols += [column(coef, 1 + t) for t in range(n)]
        b_cols.append(column(coef, n + 1))
    x_ref[...] = x.astype(x_ref.dtype)
    p_ref[...] = place(p_cols, p_ref.shape[1])
    b_ref[...] = place(b_cols, b_ref.shape[1])


def _bwd_kernel(
    h_ref, w_ref, base_ref, scale_ref, dx_ref, dp_ref, db_ref,
    dh_ref, dq_ref, dbase_ref, dscale_ref, *, n, **static,
):  # fmt: skip
    w, scale = w_ref[...], scale_ref[...]
    dx = dx_ref[...].astype(jnp.float32)
    dp, db = dp_ref[...], db_ref[...]
    d_true = static["d_true"]
    dscale = jnp.zeros(scale.shape, jnp.float32)
    for s in range(n):
        h, inv_rms, hn, act, coef = _stream(h_ref, w, base_ref, scale, s, **static)
        cols = [jnp.sum(dx * h, axis=1, keepdims=True)]
        cols += [column(dp, s * n + t) for t in range(n)]
        cols.append(column(db, s))
        dc = place(cols, coef.shape[1])
        dbase_ref[pl.ds(s, 1), :] = jnp.sum(dc, axis=0, keepdims=True)
        dscale = dscale + jnp.sum(dc * act, axis=0, keepdims=True)
        dq = dc * scale
        if static["use_tanh"]:
            dq = dq * (1.0 - act * act)
        dq_ref[s] = dq * inv_rms
        dhn = jax.lax.dot_general(dq, w, _NT, preferred_element_type=jnp.float32)
        dot = jnp.sum(dhn * h, axis=1, keepdims=True)
        dh = column(coef, 0) * dx + inv_rms * dhn - (inv_rms * inv_rms * inv_rms / d_true) * dot * h
        dh_ref[s] = dh.astype(dh_ref.dtype)
    dscale_ref[...] = dscale


# ---------------------------------------------------------------- pallas calls
def _specs(n, tile, width, lanes, p_lanes, b_lanes):
    return {
        "h": pl.BlockSpec((n, tile, width), lambda i: (0, i, 0)),
        "w": pl.BlockSpec((width, lanes), lambda i: (0, 0)),
        "base": pl.BlockSpec((n, lanes), lambda i: (0, 0)),
        "vec": pl.BlockSpec((1, lanes), lambda i: (0, 0)),
        "x": pl.BlockSpec((tile, width), lambda i: (i, 0)),
        "p": pl.BlockSpec((tile, p_lanes), lambda i: (i, 0)),
        "b": pl.BlockSpec((tile, b_lanes), lambda i: (i, 0)),
        "dq": pl.BlockSpec((n, tile, lanes), lambda i: (0, i, 0)),
        "dbase": pl.BlockSpec((None, n, lanes), lambda i: (i, 0, 0)),
        "dvec": pl.BlockSpec((None, 1, lanes), lambda i: (i, 0, 0)),
    }


def _fwd_call(h, w, base, scale, tile, target, static):
    n, n_tok, width = h.shape
    p_lanes, b_lanes = target.width(n * n), target.width(n)
    sp = _specs(n, tile, width, w.shape[1], p_lanes, b_lanes)
    return target.pallas_call(
        functools.partial(_fwd_kernel, n=n, **static),
        grid=(n_tok // tile,),
        in_specs=[sp["h"], sp["w"], sp["base"], sp["vec"]],
        out_specs=[sp["x"], sp["p"], sp["b"]],
        out_shape=[
            jax.ShapeDtypeStruct((n_tok, width), h.dtype),
            jax.ShapeDtypeStruct((n_tok, p_lanes), jnp.float32),
            jax.ShapeDtypeStruct((n_tok, b_lanes), jnp.float32),
        ],
        name="hc_pre_fwd",
    )(h, w, base, scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def hc_pre_tokens(h, w, base, scale, tile, target, static):
    """Kernel-level entry on padded arrays: ``(x, P[N, n*n], beta[N, n])``."""
    return tuple(_fwd_call(h, w, base, scale, tile, target, dict(static)))


def _vjp_fwd(h, w, base, scale, tile, target, static):
    return tuple(_fwd_call(h, w, base, scale, tile, target, dict(static))), (h, w, base, scale)


def _vjp_bwd(tile, target, static, res, cot):
    h, w, base, scale = res
    dx, dp, db = cot
    n, n_tok, width = h.shape
    lanes, n_tiles = w.shape[1], n_tok // tile
    sp = _specs(n, tile, width, lanes, dp.shape[1], db.shape[1])
    dh, dq_r, dbase, dscale = target.pallas_call(
        functools.partial(_bwd_kernel, n=n, **dict(static)),
        grid=(n_tiles,),
        in_specs=[sp["h"], sp["w"], sp["base"], sp["vec"], sp["x"], sp["p"], sp["b"]],
        out_specs=[sp["h"], sp["dq"], sp["dbase"], sp["dvec"]],
        out_shape=[
            jax.ShapeDtypeStruct(h.shape, h.dtype),
            jax.ShapeDtypeStruct((n, n_tok, lanes), jnp.float32),
            jax.ShapeDtypeStruct((n_tiles, n, lanes), jnp.float32),
            jax.ShapeDtypeStruct((n_tiles, 1, lanes), jnp.float32),
        ],
        name="hc_pre_bwd",
    )(h, w, base, scale, dx, dp, db)
    # dW = sum_s H[s]^T (r[s] dq[s]): one contraction over streams and tokens, left
    # to XLA (a per-tile partial of [d, n+2] per tile costs more memory than H).
    dw = jnp.einsum("snd,snk->dk", h, dq_r, preferred_element_type=jnp.float32)
    return dh, dw, dbase.sum(0), dscale.sum(0)


hc_pre_tokens.defvjp(_vjp_fwd, _vjp_bwd)
_hc_pre_entry = lowered_once(hc_pre_tokens)


def hc_operands(a0, beta0, w_a, w_b, s_a, s_b):
    """The kernel's folded parameters from one connector's: ``W [d, n+2]``,
    ``base [n, n+2]``, ``scale [n+2]`` (differentiable back to each)."""
    n = a0.shape[0]
    w = jnp.concatenate([w_a, w_b[:, None]], axis=-1).astype(jnp.float32)
    base = jnp.concatenate([a0, beta0[:, None]], axis=-1).astype(jnp.float32)
    scale = jnp.concatenate([jnp.broadcast_to(s_a, (n + 1,)), jnp.reshape(s_b, (1,))])
    return w, base, scale.astype(jnp.float32)


def hc_pre_reference(h_snd, w, base, scale, use_tanh: bool):
    """``HC.coefficients`` + ``read`` in plain jnp: ``(x, P[s, N, t], beta[s, N])``."""
    n, *lead, d = h_snd.shape
    h32 = h_snd.reshape(n, -1, d).astype(jnp.float32)
    hn = h32 * jax.lax.rsqrt(jnp.mean(jnp.square(h32), axis=-1, keepdims=True) + HC_EPS)
    dyn = jnp.einsum("snd,du->snu", hn, w.astype(jnp.float32))
    if use_tanh:
        dyn = jnp.tanh(dyn)
    coef = base[:, None, :] + scale * dyn
    x = coef[0, :, :1] * h32[0]
    for s in range(1, n):
        x = x + coef[s, :, :1] * h32[s]
    mix, beta = coef[..., 1 : n + 1].reshape(n, *lead, n), coef[..., n + 1].reshape(n, *lead)
    return x.astype(h_snd.dtype).reshape(*lead, d), mix, beta


def hc_pre(h_snd, w, base, scale, *, use_tanh: bool, backend="auto"):
    """Fused :func:`hc_pre_reference`: ``H[n, ..., d]``, ``W[d, n+2]``,
    ``base[n, n+2]``, ``scale[n+2]`` -> ``x[..., d]``, ``P[n, ..., n]``, ``beta[n, ...]``."""
    target = resolve(backend)
    n, *lead, d = h_snd.shape
    n_tok = 1
    for size in lead:
        n_tok *= size
    width, lanes = target.width(d), max(target.width(n + 2), 16 if target.pow2 else n + 2)
    tile = pre_tile(target, n, n_tok, width, lanes, h_snd.dtype.itemsize)
    n_pad = round_up(n_tok, tile)
    h = pad_axis(pad_axis(h_snd.reshape(n, n_tok, d), 1, n_pad), 2, width)
    w_p = pad_axis(pad_axis(w.astype(jnp.float32), 0, width), 1, lanes)
    base_p = pad_axis(base.astype(jnp.float32), 1, lanes)
    scale_p = pad_axis(scale.astype(jnp.float32), 0, lanes)[None]
    static = (("d_true", d), ("use_tanh", bool(use_tanh)))
    x, p_tk, b_tk = _hc_pre_entry(h, w_p, base_p, scale_p, tile, target, static)
    x = x[:n_tok, :d].reshape(*lead, d)
    p = jnp.moveaxis(p_tk[:n_tok, : n * n].reshape(n_tok, n, n), 1, 0).reshape(n, *lead, n)
    beta = b_tk[:n_tok, :n].T.reshape(n, *lead)
    return x, p, beta
