"""mHC pre-mix: coefficients (fused projection, gates, Sinkhorn) and the sublayer input.

Per token, for streams ``H[s]`` (``s < n``), exactly ``MHC.coefficients`` and
``MHC.read`` of ``depthbench.model.residual.mhc``, in every form the model
has (static options: ``sinkhorn`` ``log`` | ``linear`` with ``sinkhorn_eps``,
``layout`` ``in_out`` | ``out_in``, ``use_tanh``)::

    r     = rsqrt(mean_{s,d} H^2 + eps)                        (fp32)
    u     = act(r * sum_s H[s] @ phi[s])                       [n^2 + 2n], act = tanh or id
    z     = u * scale + bias      scale = [a_pre]*n + [a_post]*n + [a_res]*n^2
                                  bias  = [b_pre | b_post | B_res]
    pre   = sigmoid(z[:n]);  post = 2 sigmoid(z[n:2n])
    M     = sinkhorn(z[2n:] as n x n)     log domain, or linear with eps (sinkhorn_tile)
    P     = M (in_out: R[in, out])  or  M^T (out_in: R[out, in], Liger's)
    x     = sum_s pre[s] H[s]                                  (H's dtype)

``phi`` is fp32 here whatever its storage (``mhc_operands`` casts it, as the
model's XLA path casts a bf16 ``phi`` before the product; its gradient
flows back through that cast).  Outputs ``x``, ``P`` and ``post``
(token-major, what :mod:`stream_post` takes); the transpose of ``out_in``
is a permutation of the lanes written (and of ``dP``'s lanes read), free.
Backward (``jax.custom_vjp``): the backward kernel recomputes ``u`` and the
whole Sinkhorn iteration on chip from ``H`` (nothing but the inputs is
saved), then::

    dz      = [dpre * pre (1 - pre) | dpost * post (1 - post/2) | sinkhorn_bwd(dM)]
    du      = dz * scale * act'(u)     (act' = 1 - u^2 for tanh)
    d(scale) = sum_tok dz * u;   d(bias) = sum_tok dz
    dphi[s] = sum_tok H[s]^T (r du)  (XLA, from the kernel's r du);  g = sum_m du u_raw
    dH[s]   = (r du) @ phi[s]^T + pre[s] dx - g r^3 H[s] / (n d)

with ``dpre[s] = dx . H[s]``, ``u_raw = sum_s H[s] @ phi[s]``.
``d(scale)``, ``d(bias)`` come back as one partial sum per token tile,
summed outside (Triton has no cross-program reduction); ``dphi`` as the
per-token ``r du`` that XLA contracts with ``H``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.backend import Target, column, lowered_once, pad_axis, place, resolve, round_up
from pallas_kernels.sinkhorn_tile import KINDS, sinkhorn_tile, sinkhorn_tile_bwd

_NT = (((1,), (1,)), ((), ()))  # contract the last axes:   [a, k] x [b, k] -> [a, b]
LAYOUTS = ("in_out", "out_in")


def _forward(h_ref, phi_ref, scale, bias, *, n, d_true, eps, iters, temperature, sinkhorn,
             sinkhorn_eps, out_in, use_tanh):
    """Everything the forward computes, for both kernels (fp32)."""
    hs = [h_ref[s].astype(jnp.float32) for s in range(n)]
    sq = sum(jnp.sum(h * h, axis=1, keepdims=True) for h in hs)
    inv_r = jax.lax.rsqrt(sq / (n * d_true) + eps)
    u_raw = sum(jnp.dot(hs[s], phi_ref[s], preferred_element_type=jnp.float32) for s in range(n))
    u = u_raw * inv_r
    if use_tanh:
        u = jnp.tanh(u)
    z = u * scale + bias
    lanes = jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
    # Sinkhorn's entries k = s*n + t sit in lanes 2n + k; shift them to lane k.
    res = jnp.zeros_like(z)
    for k in range(n * n):
        res = jnp.where(lanes == k, column(z, 2 * n + k), res)
    p_mat, steps = sinkhorn_tile(res, n, iters, temperature, 1, sinkhorn, sinkhorn_eps)
    pre = [jax.nn.sigmoid(column(z, s)) for s in range(n)]
    post = [2.0 * jax.nn.sigmoid(column(z, n + t)) for t in range(n)]
    return hs, inv_r, u_raw, u, p_mat, steps, pre, post


def _entry(k: int, n: int, out_in: bool) -> int:
    """The Sinkhorn entry that lane ``k = s*n + t`` of ``P`` holds: ``M[s, t]``,
    or ``M[t, s]`` for ``out_in`` (a transpose, its own inverse)."""
    return (k % n) * n + k // n if out_in else k


def _fwd_kernel(h_ref, phi_ref, scale_ref, bias_ref, x_ref, p_ref, b_ref, **static):
    n = static["n"]
    hs, _, _, _, p_mat, _, pre, post = _forward(
        h_ref, phi_ref, scale_ref[...], bias_ref[...], **static
    )
    x = pre[0] * hs[0]
    for s in range(1, n):
        x = x + pre[s] * hs[s]
    x_ref[...] = x.astype(x_ref.dtype)
    entries = [_entry(k, n, static["out_in"]) for k in range(n * n)]
    p_ref[...] = place([column(p_mat, e) for e in entries], p_ref.shape[1])
    b_ref[...] = place(post, b_ref.shape[1])


def _bwd_kernel(
    h_ref, phi_ref, scale_ref, bias_ref, dx_ref, dp_ref, db_ref,
    dh_ref, du_ref, dscale_ref, dbias_ref, **static,
):  # fmt: skip
    n, d_true, temperature = static["n"], static["d_true"], static["temperature"]
    kind, sinkhorn_eps = static["sinkhorn"], static["sinkhorn_eps"]
    scale = scale_ref[...]
    hs, inv_r, u_raw, u, p_mat, steps, pre, post = _forward(
        h_ref, phi_ref, scale, bias_ref[...], **static
    )
    dx = dx_ref[...].astype(jnp.float32)
    entries = [_entry(k, n, static["out_in"]) for k in range(n * n)]
    dp = place([column(dp_ref[...], e) for e in entries], p_mat.shape[1])
    d_res = sinkhorn_tile_bwd(p_mat, steps, dp, n, temperature, 1, kind, sinkhorn_eps)
    cols = [jnp.sum(dx * hs[s], axis=1, keepdims=True) * pre[s] * (1.0 - pre[s]) for s in range(n)]
    cols += [column(db_ref[...], t) * post[t] * (1.0 - 0.5 * post[t]) for t in range(n)]
    cols += [column(d_res, k) for k in range(n * n)]
    dz = place(cols, u.shape[1])
    dscale_ref[...] = jnp.sum(dz * u, axis=0, keepdims=True)
    dbias_ref[...] = jnp.sum(dz, axis=0, keepdims=True)
    du = dz * scale
    if static["use_tanh"]:
        du = du * (1.0 - u * u)
    du_raw = du * inv_r
    g = jnp.sum(du * u_raw, axis=1, keepdims=True)
    coef = -g * inv_r * inv_r * inv_r / (n * d_true)
    du_ref[...] = du_raw
    for s in range(n):
        dh = jax.lax.dot_general(du_raw, phi_ref[s], _NT, preferred_element_type=jnp.float32)
        dh_ref[s] = (dh + pre[s] * dx + coef * hs[s]).astype(dh_ref.dtype)


# ---------------------------------------------------------------- pallas calls
def _specs(n, tile, width, lanes, p_lanes, b_lanes):
    return {
        "h": pl.BlockSpec((n, tile, width), lambda i: (0, i, 0)),
        "phi": pl.BlockSpec((n, width, lanes), lambda i: (0, 0, 0)),
        "vec": pl.BlockSpec((1, lanes), lambda i: (0, 0)),
        "x": pl.BlockSpec((tile, width), lambda i: (i, 0)),
        "p": pl.BlockSpec((tile, p_lanes), lambda i: (i, 0)),
        "b": pl.BlockSpec((tile, b_lanes), lambda i: (i, 0)),
        "u": pl.BlockSpec((tile, lanes), lambda i: (i, 0)),
        "dvec": pl.BlockSpec((None, 1, lanes), lambda i: (i, 0, 0)),
    }


def _fwd_call(h, phi, scale, bias, tile, target, static):
    n, n_tok, width = h.shape
    p_lanes, b_lanes = target.width(n * n), target.width(n)
    sp = _specs(n, tile, width, phi.shape[2], p_lanes, b_lanes)
    return target.pallas_call(
        functools.partial(_fwd_kernel, **static),
        grid=(n_tok // tile,),
        in_specs=[sp["h"], sp["phi"], sp["vec"], sp["vec"]],
        out_specs=[sp["x"], sp["p"], sp["b"]],
        out_shape=[
            jax.ShapeDtypeStruct((n_tok, width), h.dtype),
            jax.ShapeDtypeStruct((n_tok, p_lanes), jnp.float32),
            jax.ShapeDtypeStruct((n_tok, b_lanes), jnp.float32),
        ],
        name="mhc_pre_fwd",
    )(h, phi, scale, bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def mhc_pre_tokens(h, phi, scale, bias, tile, target, static):
    """Kernel-level entry on padded arrays: ``(x, P[N, n*n], post[N, n])``."""
    return tuple(_fwd_call(h, phi, scale, bias, tile, target, dict(static)))


def _vjp_fwd(h, phi, scale, bias, tile, target, static):
    out = tuple(_fwd_call(h, phi, scale, bias, tile, target, dict(static)))
    return out, (h, phi, scale, bias)


def _vjp_bwd(tile, target, static, res, cot):
    h, phi, scale, bias = res
    dx, dp, db = cot
    n, n_tok, width = h.shape
    lanes, n_tiles = phi.shape[2], n_tok // tile
    sp = _specs(n, tile, width, lanes, dp.shape[1], db.shape[1])
    dh, du_raw, dscale, dbias = target.pallas_call(
        functools.partial(_bwd_kernel, **dict(static)),
        grid=(n_tiles,),
        in_specs=[sp["h"], sp["phi"], sp["vec"], sp["vec"], sp["x"], sp["p"], sp["b"]],
        out_specs=[sp["h"], sp["u"], sp["dvec"], sp["dvec"]],
        out_shape=[
            jax.ShapeDtypeStruct(h.shape, h.dtype),
            jax.ShapeDtypeStruct((n_tok, lanes), jnp.float32),
            jax.ShapeDtypeStruct((n_tiles, 1, lanes), jnp.float32),
            jax.ShapeDtypeStruct((n_tiles, 1, lanes), jnp.float32),
        ],
        name="mhc_pre_bwd",
    )(h, phi, scale, bias, dx, dp, db)
    # dphi[s] = H[s]^T (r du): one contraction over all tokens, left to XLA (a
    # per-tile partial of [n, d, n^2+2n] would cost more memory than H itself).
    dphi = jnp.einsum("snd,nm->sdm", h, du_raw, preferred_element_type=jnp.float32)
    return dh, dphi, dscale.sum(0), dbias.sum(0)


mhc_pre_tokens.defvjp(_vjp_fwd, _vjp_bwd)
_mhc_pre_entry = lowered_once(mhc_pre_tokens)


def pre_tile(target: Target, n: int, n_tok: int, width: int, lanes: int, itemsize: int) -> int:
    """TPU: ``H`` and ``dH`` blocks double-buffered plus fp32 copies of the streams
    and the coefficient tiles; Triton: the streams of a tile in registers."""
    if target.kind == "tpu":
        per_token = 4 * n * width * itemsize + (n + 2) * width * 4 + 48 * lanes * 4
    else:
        per_token = (n + 2) * width * 4
    return target.token_tile(n_tok, per_token)


def _sinkhorn_reference(logits, iters: int, temperature: float, sinkhorn: str = "log",
                        sinkhorn_eps: float = 0.0):
    """Sinkhorn-Knopp (fp32), the reference the fused kernel is checked against:
    log domain (rows, then columns, ``iters`` times), or linear with ``eps`` (a
    row softmax, then divisions by column and row sums each plus ``eps``; see
    :mod:`pallas_kernels.sinkhorn_tile`).  pallas_kernels imports nothing from
    depthbench (the model imports the kernels), so the reference keeps its own
    few lines; tests/unit/test_kernels_streams.py and test_kernels_mhc_liger.py
    check the fused read against the model's own ``sinkhorn`` paths too."""
    x = logits.astype(jnp.float32) / jnp.float32(temperature)
    if sinkhorn == "linear":
        p = jax.nn.softmax(x, axis=-1) + sinkhorn_eps
        p = p / (jnp.sum(p, axis=-2, keepdims=True) + sinkhorn_eps)
        for _ in range(int(iters) - 1):
            p = p / (jnp.sum(p, axis=-1, keepdims=True) + sinkhorn_eps)
            p = p / (jnp.sum(p, axis=-2, keepdims=True) + sinkhorn_eps)
        return p
    for _ in range(iters):
        x = x - jax.nn.logsumexp(x, axis=-1, keepdims=True)
        x = x - jax.nn.logsumexp(x, axis=-2, keepdims=True)
    return jnp.exp(x)


def _options(sinkhorn: str, layout: str) -> None:
    if sinkhorn not in KINDS:
        raise ValueError(f"sinkhorn must be one of {KINDS}, not {sinkhorn!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")


def mhc_pre_reference(h_snd, phi, scale_m, bias_m, n, iters, temperature, eps, *,
                      sinkhorn="log", sinkhorn_eps=0.0, layout="in_out", use_tanh=False):
    """``MHC.coefficients`` + ``read`` in plain jnp: ``(x, P[s, N, t], post[t, N])``."""
    _options(sinkhorn, layout)
    _, *lead, d = h_snd.shape
    h32 = h_snd.reshape(n, -1, d).astype(jnp.float32)
    inv_r = jax.lax.rsqrt(jnp.mean(jnp.square(h32), axis=(0, 2)) + eps)
    u = jnp.einsum("snd,sdm->nm", h32, phi.astype(jnp.float32)) * inv_r[:, None]
    if use_tanh:
        u = jnp.tanh(u)
    z = u * scale_m + bias_m
    pre = jax.nn.sigmoid(z[:, :n])
    post = 2.0 * jax.nn.sigmoid(z[:, n : 2 * n])
    m_ntt = _sinkhorn_reference(z[:, 2 * n :].reshape(-1, n, n), iters, temperature, sinkhorn,
                                sinkhorn_eps)
    p_nst = m_ntt if layout == "in_out" else jnp.swapaxes(m_ntt, -1, -2)
    x = jnp.sum(pre.T[..., None] * h32, axis=0).astype(h_snd.dtype).reshape(*lead, d)
    mix = jnp.moveaxis(p_nst, 1, 0).reshape(n, *lead, n)
    return x, mix, post.T.reshape(n, *lead)


def mhc_pre(h_snd, phi, scale_m, bias_m, *, iters, temperature, eps, sinkhorn="log",
            sinkhorn_eps=0.0, layout="in_out", use_tanh=False, backend="auto"):
    """Fused :func:`mhc_pre_reference`.  ``H[n, ..., d]``, ``phi[n, d, n^2+2n]``,
    ``scale``/``bias`` ``[n^2 + 2n]``; returns ``x[..., d]``, ``P[n, ..., n]``,
    ``post[n, ...]`` (the model's layouts).  ``sinkhorn``: ``log`` (PyTorch mHC)
    or ``linear`` (Liger's, ``sinkhorn_eps`` added to every sum); ``layout``:
    ``in_out`` (``P = M``) or ``out_in`` (``P = M^T``, Liger's); ``use_tanh``:
    ``tanh`` on ``u`` before the gates."""
    _options(sinkhorn, layout)
    target = resolve(backend)
    n, *lead, d = h_snd.shape
    n_tok = 1
    for size in lead:
        n_tok *= size
    m = n * n + 2 * n
    width, lanes = target.width(d), max(target.width(m), 16 if target.pow2 else m)
    tile = pre_tile(target, n, n_tok, width, lanes, h_snd.dtype.itemsize)
    n_pad = round_up(n_tok, tile)
    h = pad_axis(pad_axis(h_snd.reshape(n, n_tok, d), 1, n_pad), 2, width)
    phi_p = pad_axis(pad_axis(phi.astype(jnp.float32), 1, width), 2, lanes)
    scale = pad_axis(scale_m.astype(jnp.float32), 0, lanes)[None]
    bias = pad_axis(bias_m.astype(jnp.float32), 0, lanes)[None]
    static = (
        ("n", n), ("d_true", d), ("eps", float(eps)),
        ("iters", int(iters)), ("temperature", float(temperature)),
        ("sinkhorn", sinkhorn), ("sinkhorn_eps", float(sinkhorn_eps)),
        ("out_in", layout == "out_in"), ("use_tanh", bool(use_tanh)),
    )  # fmt: skip
    x, p_tk, b_tk = _mhc_pre_entry(h, phi_p, scale, bias, tile, target, static)
    x = x[:n_tok, :d].reshape(*lead, d)
    p = jnp.moveaxis(p_tk[:n_tok, : n * n].reshape(n_tok, n, n), 1, 0).reshape(n, *lead, n)
    post = b_tk[:n_tok, :n].T.reshape(n, *lead)
    return x, p, post


def mhc_operands(phi, a_pre, a_post, a_res, b_pre, b_post, b_res):
    """The kernel's folded parameters from one connector's: ``phi [n, d, n^2+2n]``,
    ``scale`` and ``bias`` ``[n^2 + 2n]`` (differentiable back to each)."""
    n = b_pre.shape[0]
    scale = jnp.concatenate(
        [
            jnp.broadcast_to(a_pre, (n,)),
            jnp.broadcast_to(a_post, (n,)),
            jnp.broadcast_to(a_res, (n * n,)),
        ]
    )
    bias = jnp.concatenate([b_pre, b_post, b_res.reshape(n * n)])
    return phi.astype(jnp.float32), scale.astype(jnp.float32), bias.astype(jnp.float32)
