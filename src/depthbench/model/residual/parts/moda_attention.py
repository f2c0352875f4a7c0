"""moda's attention: one softmax over the causal sequence keys and depth keys.

The attention sublayer of a moda block (``residual/moda.py``) scores, besides
the causal sequence keys, the depth keys earlier sublayers wrote at the same
token; the family hands :func:`attention_with_depth` to the backbone's
attention through ``capabilities.DepthAttention``.  The sequence part is the
backbone's own causal attention (``model/layers.py``), plus a decoder's
cached keys of earlier positions (``model/past_attention.py``), merged with
the depth parts by their log-sum-exps.
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp

from depthbench.model.layers import causal_part
from depthbench.model.past_attention import PastKeys, merge_parts, past_part
from depthbench.model.residual.protocol.base import keep_for_backward


def attention_with_depth(q_btnh, k_btkh, v_btkh, q_depth_btnh, groups,
                         past: PastKeys | None = None, segments_bt=None):
    """Causal attention whose softmax also covers depth keys at the same token.

    Sequence logits use the rotated ``q_btnh`` against rotated ``k``; depth
    logits use ``q_depth_btnh`` (the rotated or the unrotated query: the
    family decides) against each group's depth keys.  ``groups`` is a sequence
    of ``(k_btgmh, v_btgmh, valid_m)``, each with its own number of key heads
    ``g`` dividing ``n`` (query head ``i`` uses key head ``i // (n / g)``, as
    in GQA); invalid slots are masked.  ``past``: the sequence keys of earlier
    positions (a decode step's cache), seen by every token; ``segments_bt``:
    the documents of a packed row (sequence keys of another document are
    masked; depth keys are the token's own, so they never cross).  One
    softmax over all of it, in fp32, scale ``1/sqrt(d_h)``::

        out = (sum_s e^(l_s) v_s + sum_m e^(l_m) v_m) / (sum of the e^)

    computed in parts, each normalised on its own with its log-sum-exp, then
    merged by those (:func:`~depthbench.model.past_attention.merge_parts`):
    the sequence part is :func:`causal_attention`'s (causal query blocks, its
    layout, the flash-style backward), each group of depth keys is
    :func:`_depth_part` (``m`` keys per token).

    Query heads are grouped per key head (as :func:`causal_attention`), never
    repeated, and the parts are not concatenated: no key or logit tensor is
    copied per query head.
    """
    b, t, n, h = q_btnh.shape
    scale = 1.0 / jnp.sqrt(jnp.float32(h))
    q = q_btnh.astype(jnp.float32) * scale
    parts = [causal_part(q, k_btkh.astype(jnp.float32), v_btkh.astype(jnp.float32),
                         segments_bt)]
    if past is not None:
        parts.append(past_part(q, past))
    qd_btnh = q_depth_btnh.astype(jnp.float32) * scale
    for chunks in _depth_parts(groups):
        g = chunks[0][0].shape[2]
        out_btgrh, lse_btgr = _depth_part(qd_btnh.reshape(b, t, g, n // g, h),
                                          tuple(k.astype(jnp.float32) for k, _, _ in chunks),
                                          tuple(v.astype(jnp.float32) for _, v, _ in chunks),
                                          tuple(valid for _, _, valid in chunks))
        parts.append((out_btgrh.reshape(b, t, n, h), lse_btgr.reshape(b, t, n)))
    # The sequence part's lse is finite (the diagonal key is always there), so
    # the joint one is; a depth part with no valid key has lse -inf: weight 0.
    return merge_parts(parts).astype(q_btnh.dtype)


def _depth_parts(groups):
    """``groups`` split into softmax parts: consecutive groups with the same
    number of key heads (moda's cache chunks, and its attention and MLP
    caches where their heads agree) make one part, their keys concatenated
    in the softmax (only the logits are joined, never the caches)."""
    parts = []
    for group in groups:
        if parts and parts[-1][0][0].shape[2] == group[0].shape[2]:
            parts[-1].append(group)
        else:
            parts.append([group])
    return parts


@jax.custom_vjp
def _depth_part(q_btgrh, ks_btgmh, vs_btgmh, valids_m):
    """Softmax attention of each token's query heads over that token's own
    depth keys, given in chunks (``ks``, ``vs``: sequences of ``[B, T, g, m_c,
    h]``, ``valids``: of ``[m_c]``; ``r`` query heads per key head; fp32, the
    query scaled): returns the output ``[B, T, g, r, h]`` and each row's
    log-sum-exp ``[B, T, g, r]`` (``-inf`` and output 0 where no slot is
    valid).  Each chunk's products are their own batched dots; only their
    logits are concatenated, for the one softmax.

    Differentiated by hand from the saved probabilities (the flash form, as
    :func:`causal_blocks`): ``dv = p^T do``, ``ds = p (do v^T - D)`` with ``D
    = rowsum(do * o) - dlse``, ``dq = ds k``, ``dk = ds^T q``: faster than
    autodiff of the joint softmax's lines (two exponentials per key and their
    gradients; bench/results/depth_memory.md, "moda's depth part with a
    hand-written backward")."""
    return _depth_part_fwd(q_btgrh, ks_btgmh, vs_btgmh, valids_m)[0]


def _split(x_btgrm, chunks):
    """``x``'s last axis cut back into the chunks' slots."""
    if len(chunks) == 1:
        return [x_btgrm]
    ends = [0]
    for k in chunks:
        ends.append(ends[-1] + k.shape[3])
    return [x_btgrm[..., a:e] for a, e in zip(ends[:-1], ends[1:], strict=True)]


def _join(xs):
    return xs[0] if len(xs) == 1 else jnp.concatenate(xs, axis=-1)


def _depth_part_fwd(q_btgrh, ks_btgmh, vs_btgmh, valids_m):
    logits = _join([jnp.einsum("btgrh,btgmh->btgrm", q_btgrh, k) for k in ks_btgmh])
    logits = jnp.where(_join(list(valids_m)), logits, -jnp.inf)
    mu = jnp.max(logits, axis=-1, keepdims=True)
    mu = jnp.where(mu > -jnp.inf, mu, 0.0)  # no valid slot: every e^ is 0
    e_btgrm = jnp.exp(logits - mu)
    sum_btgr1 = jnp.sum(e_btgrm, axis=-1, keepdims=True)
    p_btgrm = e_btgrm / jnp.where(sum_btgr1 > 0, sum_btgr1, 1.0)
    p_btgrm = keep_for_backward(p_btgrm)  # as causal_blocks' output: batched products
    out_btgrh = keep_for_backward(functools.reduce(operator.add, [
        jnp.einsum("btgrm,btgmh->btgrh", p, v)
        for p, v in zip(_split(p_btgrm, ks_btgmh), vs_btgmh, strict=True)]))
    lse_btgr = keep_for_backward((mu + jnp.log(sum_btgr1))[..., 0])
    return (out_btgrh, lse_btgr), (q_btgrh, ks_btgmh, vs_btgmh, p_btgrm, out_btgrh)


def _depth_part_bwd(saved, cts):
    q_btgrh, ks_btgmh, vs_btgmh, p_btgrm, out_btgrh = saved
    dout_btgrh, dlse_btgr = cts
    ps = _split(p_btgrm, ks_btgmh)
    dvs = tuple(jnp.einsum("btgrm,btgrh->btgmh", p, dout_btgrh) for p in ps)
    dp_btgrm = _join([jnp.einsum("btgrh,btgmh->btgrm", dout_btgrh, v) for v in vs_btgmh])
    rowdot_btgr1 = (jnp.sum(dout_btgrh * out_btgrh, axis=-1) - dlse_btgr)[..., None]
    dss = _split(p_btgrm * (dp_btgrm - rowdot_btgr1), ks_btgmh)
    dq_btgrh = functools.reduce(operator.add, [jnp.einsum("btgrm,btgmh->btgrh", ds, k)
                                               for ds, k in zip(dss, ks_btgmh, strict=True)])
    dks = tuple(jnp.einsum("btgrm,btgrh->btgmh", ds, q_btgrh) for ds in dss)
    return dq_btgrh, dks, dvs, None


_depth_part.defvjp(_depth_part_fwd, _depth_part_bwd)
