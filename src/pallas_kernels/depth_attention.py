"""AttnRes depth attention: one fused pass over the sources per token tile.

For sources ``V[S, N, d]`` (``S`` depth slots, ``N`` tokens), a validity mask
``valid[S]``, a pseudo-query ``q[d]`` and a key-norm weight ``w[d]``, per token::

    r_s     = rsqrt(mean_d v_s^2 + eps)
    logit_s = r_s * sum_d (q * w)[d] v_s[d]              (invalid: -inf)
    p       = softmax_s(logit)                            (fp32)
    h       = sum_s p_s v_s                               (in V's dtype)

exactly :func:`depthbench.model.residual.parts.depth_mix.depth_mix` (fp32 maths,
output cast back to the bank's dtype).  :func:`depth_attention_reference`
is that computation in plain ``jnp``.

Forward: an online softmax over ``s`` (running max ``m``, sum ``l``,
accumulator) reads each source tile once and saves ``lse = m + log l`` per
token.  Backward (``jax.custom_vjp``), with ``g_s = dL/dlogit_s``::

    p_s    = exp(logit_s - lse)
    D      = sum_s p_s (dh . v_s)                          (= dh . h)
    g_s    = p_s (dh . v_s - D)
    dv_s   = p_s dh + g_s r_s (qw - logit_s r_s v_s / d)
    d(qw)  = sum_tokens sum_s g_s r_s v_s

``D`` needs all sources before any ``dv_s`` can be written, so the backward
kernel walks the sources twice; on TPU the whole ``[S, tile, d]`` block sits
in VMEM, so HBM is still read once.  ``d(qw)`` comes back as one partial sum
per tile (no cross-program accumulation, which Triton lacks) and is summed
outside; ``dq = d(qw) * w`` and ``dw = d(qw) * q`` follow by autodiff of the
product outside the kernel.

Edge cases: a token whose sources are all masked has no defined mix (the
reference gives NaN; the model always has slot 0 valid).  ``S = 1`` is the
identity (in V's dtype).  Zero-padded tokens (tile remainder) produce
``h = 0`` and, with zero cotangent, contribute nothing to ``d(qw)``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.backend import Target, lowered_once, pad_axis, resolve, round_up

# Finite start of the running max: exp(-inf - -inf) would be NaN on a tile
# whose first sources are masked.
_NEG_BIG = -1e30


def depth_attention_reference(v_snd, valid_s, query_d, key_norm_d, eps: float):
    """The XLA path (``depth_mix.depth_mix`` on flattened tokens): ``[N, d]``."""
    v32 = v_snd.astype(jnp.float32)
    qw_d = query_d.astype(jnp.float32) * key_norm_d.astype(jnp.float32)
    inv_rms_sn = jax.lax.rsqrt(jnp.mean(jnp.square(v32), axis=-1) + eps)
    logits_sn = jnp.einsum("snd,d->sn", v32, qw_d) * inv_rms_sn
    logits_sn = jnp.where(valid_s[:, None], logits_sn, -jnp.inf)
    p_sn = jax.nn.softmax(logits_sn, axis=0)
    return jnp.einsum("sn,snd->nd", p_sn, v32).astype(v_snd.dtype)


# ---------------------------------------------------------------- kernels
def _source_logit(v_ref, s, qw_1d, d_true: int, eps: float):
    """Source ``s`` of the tile in fp32, its ``r_s`` and its logit (``[tile, 1]``)."""
    v = v_ref[s].astype(jnp.float32)
    inv_rms = jax.lax.rsqrt(jnp.sum(v * v, axis=1, keepdims=True) / d_true + eps)
    logit = jnp.sum(v * qw_1d, axis=1, keepdims=True) * inv_rms
    return v, inv_rms, logit


def _fwd_kernel(valid_ref, qw_ref, v_ref, h_ref, lse_ref, *, d_true: int, eps: float):
    qw = qw_ref[...]
    tile = h_ref.shape[0]

    def step(s, carry):
        m, denom, acc = carry
        v, _, logit = _source_logit(v_ref, s, qw, d_true, eps)
        logit = jnp.where(valid_ref[s] > 0, logit, -jnp.inf)
        m_new = jnp.maximum(m, logit)
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(logit - m_new)
        return m_new, alpha * denom + p, alpha * acc + p * v

    init = (
        jnp.full((tile, 1), _NEG_BIG, jnp.float32),
        jnp.zeros((tile, 1), jnp.float32),
        jnp.zeros(h_ref.shape, jnp.float32),
    )
    m, denom, acc = jax.lax.fori_loop(0, v_ref.shape[0], step, init)
    h_ref[...] = (acc / denom).astype(h_ref.dtype)
    lse_ref[...] = m + jnp.log(denom)


def _bwd_kernel(
    valid_ref, qw_ref, v_ref, dh_ref, lse_ref, dv_ref, dqw_ref, *, d_true: int, eps: float
):
    qw = qw_ref[...]
    dh = dh_ref[...].astype(jnp.float32)
    lse = lse_ref[...]
    n_src = v_ref.shape[0]

    def prob(s):
        v, inv_rms, logit = _source_logit(v_ref, s, qw, d_true, eps)
        p = jnp.where(valid_ref[s] > 0, jnp.exp(logit - lse), 0.0)
        return v, inv_rms, logit, p

    def dot_step(s, d_acc):
        v, _, _, p = prob(s)
        return d_acc + p * jnp.sum(dh * v, axis=1, keepdims=True)

    big_d = jax.lax.fori_loop(0, n_src, dot_step, jnp.zeros(lse.shape, jnp.float32))

    def grad_step(s, dqw):
        v, inv_rms, logit, p = prob(s)
        g = p * (jnp.sum(dh * v, axis=1, keepdims=True) - big_d)
        dv = p * dh + g * inv_rms * (qw - (logit * inv_rms / d_true) * v)
        dv_ref[s] = dv.astype(dv_ref.dtype)
        return dqw + jnp.sum(g * inv_rms * v, axis=0, keepdims=True)

    dqw = jax.lax.fori_loop(0, n_src, grad_step, jnp.zeros(qw.shape, jnp.float32))
    dqw_ref[...] = dqw


# ---------------------------------------------------------------- pallas calls
def _specs(target: Target, n_src: int, tile: int, width: int):
    valid = (
        pl.BlockSpec(memory_space=_tpu_smem())
        if target.kind == "tpu" and not target.interpret
        else pl.BlockSpec((n_src,), lambda i: (0,))
    )
    return {
        "valid": valid,
        "qw": pl.BlockSpec((1, width), lambda i: (0, 0)),
        "src": pl.BlockSpec((n_src, tile, width), lambda i: (0, i, 0)),
        "tok": pl.BlockSpec((tile, width), lambda i: (i, 0)),
        "stat": pl.BlockSpec((tile, 1), lambda i: (i, 0)),
        "part": pl.BlockSpec((None, 1, width), lambda i: (i, 0, 0)),
    }


def _tpu_smem():
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.SMEM


def _fwd_call(v_snd, valid_s, qw_1d, eps, d_true, tile, target):
    n_src, n_tok, width = v_snd.shape
    sp = _specs(target, n_src, tile, width)
    return target.pallas_call(
        functools.partial(_fwd_kernel, d_true=d_true, eps=eps),
        grid=(n_tok // tile,),
        in_specs=[sp["valid"], sp["qw"], sp["src"]],
        out_specs=[sp["tok"], sp["stat"]],
        out_shape=[
            jax.ShapeDtypeStruct((n_tok, width), v_snd.dtype),
            jax.ShapeDtypeStruct((n_tok, 1), jnp.float32),
        ],
        name="attnres_depth_attention_fwd",
    )(valid_s, qw_1d, v_snd)


def _bwd_call(v_snd, valid_s, qw_1d, dh_nd, lse_n1, eps, d_true, tile, target):
    n_src, n_tok, width = v_snd.shape
    sp = _specs(target, n_src, tile, width)
    n_tiles = n_tok // tile
    return target.pallas_call(
        functools.partial(_bwd_kernel, d_true=d_true, eps=eps),
        grid=(n_tiles,),
        in_specs=[sp["valid"], sp["qw"], sp["src"], sp["tok"], sp["stat"]],
        out_specs=[sp["src"], sp["part"]],
        out_shape=[
            jax.ShapeDtypeStruct(v_snd.shape, v_snd.dtype),
            jax.ShapeDtypeStruct((n_tiles, 1, width), jnp.float32),
        ],
        name="attnres_depth_attention_bwd",
    )(valid_s, qw_1d, v_snd, dh_nd, lse_n1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _fused(v_snd, valid_s, qw_1d, eps, d_true, tile, target):
    return _fwd_call(v_snd, valid_s, qw_1d, eps, d_true, tile, target)[0]


def _fused_fwd(v_snd, valid_s, qw_1d, eps, d_true, tile, target):
    h, lse = _fwd_call(v_snd, valid_s, qw_1d, eps, d_true, tile, target)
    return h, (v_snd, valid_s, qw_1d, lse)


def _fused_bwd(eps, d_true, tile, target, res, dh):
    v_snd, valid_s, qw_1d, lse = res
    dv, dqw_parts = _bwd_call(v_snd, valid_s, qw_1d, dh, lse, eps, d_true, tile, target)
    return dv, None, jnp.sum(dqw_parts, axis=0)


_fused.defvjp(_fused_fwd, _fused_bwd)
_entry = lowered_once(_fused)


def source_tile(target: Target, n_src: int, n_tok: int, width: int, itemsize: int) -> int:
    """Token tile for ``S`` sources: TPU holds the ``[S, tile, d]`` block (in and,
    backward, out, double-buffered) plus fp32 temporaries in VMEM; Triton keeps
    about four ``[tile, d]`` fp32 arrays live."""
    if target.kind == "tpu":
        per_token = 4 * n_src * width * itemsize + 6 * width * 4
    else:
        per_token = 4 * width * 4
    return target.token_tile(n_tok, per_token)


def depth_attention(
    v_snd: jax.Array,
    valid_s: jax.Array,
    query_d: jax.Array,
    key_norm_d: jax.Array,
    eps: float,
    backend: str | Target | None = "auto",
) -> jax.Array:
    """Fused :func:`depth_attention_reference`: ``V[S, ..., d]`` -> ``h[..., d]``.

    Differentiable in ``V``, ``query`` and ``key_norm`` (not in ``valid``)."""
    target = resolve(backend)
    n_src, *lead, d = v_snd.shape
    n_tok = 1
    for size in lead:
        n_tok *= size
    width = target.width(d)
    tile = source_tile(target, n_src, n_tok, width, v_snd.dtype.itemsize)
    v = pad_axis(pad_axis(v_snd.reshape(n_src, n_tok, d), 1, round_up(n_tok, tile)), 2, width)
    qw = query_d.astype(jnp.float32) * key_norm_d.astype(jnp.float32)
    qw = pad_axis(qw, 0, width)[None, :]
    valid = valid_s.astype(jnp.int32)
    h = _entry(v, valid, qw, float(eps), d, tile, target)
    return h[:n_tok, :d].reshape(*lead, d)
