"""Two-phase Block AttnRes for prefill and inference (AttnRes paper, Block AttnRes).

Every sublayer of block ``b`` mixes the same completed sources (``x0`` and
the committed blocks) plus the block's running partial, each with its own
query.  So a block is served in two phases:

1. **Batched pass** (:func:`completed_sources_attention`, one kernel): for
   the ``K`` queries of the block, one read of the completed sources
   ``V[S, N, d]`` yields per query and token the normalised partial mix
   ``o_k = sum_s softmax_s(logit_ks) v_s`` and ``lse_k = logsumexp_s logit_ks``
   (fp32), each source tile read once for all ``K`` queries.
2. **Merge** (:func:`merge_partial`, per sublayer as it runs): one more
   source, the partial ``v_p``, folded in by the online-softmax rule::

       l_p = logit(v_p);  m = max(lse_k, l_p)
       h   = (e^(lse_k - m) o_k + e^(l_p - m) v_p) / (e^(lse_k - m) + e^(l_p - m))

   The first sublayer of a block has no partial and reads ``o_k`` itself.

The result equals :func:`depth_attention` over ``[V; v_p]`` with the same
mask (to fp32 rounding).  Forward only: this is the inference path.
The merge is elementwise over ``[N, d]`` and left to XLA, which fuses it
into one pass (a kernel would read and write the same bytes).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.backend import Target, pad_axis, resolve, round_up
from pallas_kernels.depth_attention import _NEG_BIG, _specs


def _multi_kernel(valid_ref, qw_ref, v_ref, o_ref, lse_ref, *, d_true: int, eps: float):
    n_query, tile = qw_ref.shape[0], o_ref.shape[1]
    qws = [qw_ref[pl.ds(k, 1), :] for k in range(n_query)]

    def step(s, carry):
        v = v_ref[s].astype(jnp.float32)
        inv_rms = jax.lax.rsqrt(jnp.sum(v * v, axis=1, keepdims=True) / d_true + eps)
        ok = valid_ref[s] > 0
        out = []
        for k in range(n_query):
            m, denom, acc = carry[k]
            logit = jnp.where(ok, jnp.sum(v * qws[k], axis=1, keepdims=True) * inv_rms, -jnp.inf)
            m_new = jnp.maximum(m, logit)
            alpha, p = jnp.exp(m - m_new), jnp.exp(logit - m_new)
            out.append((m_new, alpha * denom + p, alpha * acc + p * v))
        return tuple(out)

    init = tuple(
        (
            jnp.full((tile, 1), _NEG_BIG, jnp.float32),
            jnp.zeros((tile, 1), jnp.float32),
            jnp.zeros((tile, o_ref.shape[2]), jnp.float32),
        )
        for _ in range(n_query)
    )
    final = jax.lax.fori_loop(0, v_ref.shape[0], step, init)
    for k, (m, denom, acc) in enumerate(final):
        o_ref[k] = acc / denom
        lse_ref[k] = m + jnp.log(denom)


def completed_sources_attention(
    v_snd, valid_s, query_kd, key_norm_kd, eps: float, backend: str | Target | None = "auto"
):
    """Phase 1: ``(o[K, ..., d], lse[K, ...])`` in fp32 for ``K`` queries at once."""
    target = resolve(backend)
    n_src, *lead, d = v_snd.shape
    n_query = query_kd.shape[0]
    n_tok = 1
    for size in lead:
        n_tok *= size
    width = target.width(d)
    per_token = (
        2 * n_src * width * v_snd.dtype.itemsize + (2 * n_query + 2) * width * 4
        if target.kind == "tpu"
        else (n_query + 2) * width * 4
    )
    tile = target.token_tile(n_tok, per_token)
    n_pad = round_up(n_tok, tile)
    v = pad_axis(pad_axis(v_snd.reshape(n_src, n_tok, d), 1, n_pad), 2, width)
    qw = pad_axis(query_kd.astype(jnp.float32) * key_norm_kd.astype(jnp.float32), 1, width)
    sp = _specs(target, n_src, tile, width)
    o, lse = target.pallas_call(
        functools.partial(_multi_kernel, d_true=d, eps=float(eps)),
        grid=(n_pad // tile,),
        in_specs=[sp["valid"], pl.BlockSpec((n_query, width), lambda i: (0, 0)), sp["src"]],
        out_specs=[
            pl.BlockSpec((n_query, tile, width), lambda i: (0, i, 0)),
            pl.BlockSpec((n_query, tile, 1), lambda i: (0, i, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((n_query, n_pad, width), jnp.float32),
            jax.ShapeDtypeStruct((n_query, n_pad, 1), jnp.float32),
        ],
        name="attnres_completed_sources",
    )(valid_s.astype(jnp.int32), qw, v)
    return o[:, :n_tok, :d].reshape(n_query, *lead, d), lse[:, :n_tok, 0].reshape(n_query, *lead)


def merge_partial(o_nd, lse_n, partial_nd, query_d, key_norm_d, eps: float):
    """Phase 2: fold the running partial into a phase-1 mix; ``h`` in the partial's dtype."""
    v = partial_nd.astype(jnp.float32)
    qw = query_d.astype(jnp.float32) * key_norm_d.astype(jnp.float32)
    logit = jnp.einsum("...d,d->...", v, qw) * jax.lax.rsqrt(jnp.mean(v * v, axis=-1) + eps)
    m = jnp.maximum(lse_n, logit)
    a, b = jnp.exp(lse_n - m)[..., None], jnp.exp(logit - m)[..., None]
    return ((a * o_nd + b * v) / (a + b)).astype(partial_nd.dtype)
