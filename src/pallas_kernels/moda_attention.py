"""MoDA's joint softmax: causal sequence keys and the token's own depth keys, fused.

For one attention sublayer of a moda block (``depthbench.model.residual.parts.
moda_attention.attention_with_depth`` without a decoder's past keys or packed
rows' segments), per batch row, query head ``n`` and token ``t``::

    l_s   = c q_t . k_s            s <= t (causal), key head n // (N / K)
    l_gj  = c qd_t . kd_g[t, j]    slot j of depth group g, key head n // (N / g_g);
                                   -inf where valid_g[j] is false
    lse_t = log(sum_s e^l_s + sum_gj e^l_gj)
    out_t = sum_s e^(l_s - lse) v_s + sum_gj e^(l_gj - lse) vd_g[t, j]

with ``c = 1 / sqrt(d_h)``, fp32 maths (the model's XLA path casts every
operand to fp32), the output in the query's dtype.  ``q`` is the rotated
query; ``qd`` the depth query (the same array when moda's depth query is the
rotated one); each group ``(kd [B, T, g, m, d_h], vd, valid [m])`` has its own
number of key heads ``g`` dividing ``N`` and its own slot count ``m``.
:func:`moda_attention_reference` is that computation in plain ``jnp`` (one
concatenated softmax); the model's XLA path computes it in parts merged by
their log-sum-exps, and equals it to rounding.

What is fused: **everything** of the joint softmax.  Forward, one program per
(batch row, query head, query tile of ``tile`` tokens): an online softmax
(running max, sum, accumulator, as flash attention) over the causal key tiles
``0 .. i`` of the sequence (dots on the MXU / tensor cores, the diagonal tile
masked), then over each group's ``m`` depth slots of the tile's own tokens
(per slot a ``[tile, d_h]`` row-wise dot: the depth keys are per token, so
there is no matmul to make), the output normalised once and
``lse = max + log sum`` saved per row.  This is the original's layout
(hustvl/MoDA ``libs/moda_triton``: per query head and query block, the
sequence key blocks and then the block's tokens' depth keys in one online
softmax), except that the original scores the depth keys with a dense
``[BT, BT * L]`` product masked down to each row's own token, where here each
slot is one ``[tile, d_h]`` product per token.

Backward (``jax.custom_vjp``) from ``q, k, v, qd, kd, vd, out, lse``; with
``D = rowsum(dout * out)`` (computed outside, one fused XLA reduction) and
``p = e^(l - lse)`` recomputed::

    ds   = p (dout . v - D)                          (each key, sequence or depth)
    dq   = c sum_s ds_s k_s        dqd = c sum_gj ds_gj kd_gj
    dk_s = c sum_t ds_ts q_t       dv_s = sum_t p_ts dout_t
    dkd  = c sum_heads ds qd       dvd  = sum_heads p dout   (per token and slot)

in three kinds of kernels, each writing only its own outputs (Triton has no
cross-program accumulation): ``_bwd_dq`` per (row, query head, query tile):
``dq`` over the causal key tiles and ``dqd`` over the depth slots;
``_bwd_dkv`` per (row, query head, key tile): that head's share of ``dk,
dv`` over the query tiles ``j ..`` (the ``N / K`` query heads of a key head
are summed outside, an ``[B, N, T, d_h]`` partial per head, as the
original's GQA backward does); ``_bwd_depth`` per group and (row, depth key
head, tile): ``dkd, dvd`` per slot, the key head's ``N / g`` query heads
summed inside the program.

Layout: queries, keys and values are transposed to ``[B, heads, T, d_h]``
(Mosaic tiles the last two dims, so a head must be its own block dim); the
depth caches are read in the model's ``[B, T, g, m, d_h]`` layout, no copy
(a ``[tile, m, d_h]`` block per program, one slot read at a time).  Each
program holds its key head's whole sequence keys and values (forward, ``dq``)
or its query head's whole queries and output cotangents (``dkv``) as one
block and walks them tile by tile: on TPU that block sits in VMEM
(``2 T d_h`` elements, double-buffered), which bounds ``T d_h`` (fp32,
``d_h`` 128: about ``T`` 4096 in 16 MiB); on GPU it is a pointer.

Edge cases: every row has at least its own sequence key, so ``lse`` is
finite; a group with no valid slot adds nothing (its ``e^`` are 0).  Token
counts that are not a tile multiple are zero-padded: a padded key sits after
every real query (causally unseen), a padded query's output is cut off and
its zero cotangent contributes nothing.  Head dims are zero-padded to a power
of two (and at least 16, ``tl.dot``'s minimum) on GPU; the scale uses the
true ``d_h``.  Dots run in fp32 at ``Precision.HIGHEST`` (IEEE on Triton, not
TF32), as the XLA path computes them.  Segments (packed rows) and a decoder's
past keys are not taken here: the model runs those in XLA.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.backend import Target, lowered_once, pad_axis, resolve, round_up

_NEG_BIG = -1e30  # finite start of the running max (exp(-inf - -inf) is NaN)
_HIGHEST = jax.lax.Precision.HIGHEST


# ---------------------------------------------------------------- reference
def moda_attention_reference(q_btnh, k_btkh, v_btkh, q_depth_btnh, groups):
    """One softmax over the causal sequence keys and every group's valid depth
    slots, by concatenating the logits (fp32; output in ``q``'s dtype)."""
    b, t, n, h = q_btnh.shape
    scale = 1.0 / math.sqrt(h)

    def per_query_head(x, heads):  # [B, T, heads, ...] -> [B, T, N, ...] (GQA)
        return jnp.repeat(x.astype(jnp.float32), n // heads, axis=2)

    q = q_btnh.astype(jnp.float32) * scale
    qd = q_depth_btnh.astype(jnp.float32) * scale
    k, v = per_query_head(k_btkh, k_btkh.shape[2]), per_query_head(v_btkh, v_btkh.shape[2])
    logits = [jnp.where(jnp.tril(jnp.ones((t, t), bool))[None, None],
                        jnp.einsum("btnh,bsnh->bnts", q, k), -jnp.inf)]
    values = [(v, "bnts,bsnh->btnh")]
    for kd, vd, valid in groups:
        g = kd.shape[2]
        kd, vd = per_query_head(kd, g), per_query_head(vd, g)
        logits.append(jnp.where(valid[None, None, None, :],
                                jnp.einsum("btnh,btnmh->bntm", qd, kd), -jnp.inf))
        values.append((vd, "bntm,btnmh->btnh"))
    p = jax.nn.softmax(jnp.concatenate(logits, axis=-1), axis=-1)
    out, start = 0.0, 0
    for (val, spec), lg in zip(values, logits, strict=True):
        width = lg.shape[-1]
        out = out + jnp.einsum(spec, p[..., start:start + width], val)
        start += width
    return out.astype(q_btnh.dtype)


# ---------------------------------------------------------------- in-kernel helpers
def _dot_t(a, b):
    """``a @ b^T`` in fp32 (IEEE on Triton)."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=_HIGHEST,
                               preferred_element_type=jnp.float32)


def _dot(a, b):
    return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=_HIGHEST,
                               preferred_element_type=jnp.float32)


def _tdot(a, b):
    """``a^T @ b`` in fp32."""
    return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), precision=_HIGHEST,
                               preferred_element_type=jnp.float32)


def _causal(i, j, tile):
    """``[tile, tile]``: key ``j * tile + c`` is at or before query ``i * tile + r``."""
    rows = i * tile + jax.lax.broadcasted_iota(jnp.int32, (tile, tile), 0)
    cols = j * tile + jax.lax.broadcasted_iota(jnp.int32, (tile, tile), 1)
    return cols <= rows


def _rows(ref, j, tile):
    return ref[pl.ds(pl.multiple_of(j * tile, tile), tile), :].astype(jnp.float32)


def _slot(ref, s):
    return ref[:, s, :].astype(jnp.float32)


def _split(refs, n_groups: int, counts: Sequence[int]):
    """Cut ``refs`` into consecutive pieces: ``n_groups`` refs where a count is
    None, else that many single refs."""
    out, at = [], 0
    for c in counts:
        if c is None:
            out.append(refs[at:at + n_groups])
            at += n_groups
        else:
            out.extend(refs[at:at + c])
            at += c
    return out


# ---------------------------------------------------------------- kernels
def _fwd_kernel(*refs, n_groups: int, tile: int, scale: float):
    valids, q_ref, k_ref, v_ref, qd_ref, kds, vds, o_ref, lse_ref = _split(
        refs, n_groups, (None, 1, 1, 1, 1, None, None, 1, 1))
    i = pl.program_id(2)
    q = q_ref[...].astype(jnp.float32) * scale

    def seq_step(j, carry):
        m, denom, acc = carry
        kb, vb = _rows(k_ref, j, tile), _rows(v_ref, j, tile)
        s = jnp.where(_causal(i, j, tile), _dot_t(q, kb), -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        alpha, p = jnp.exp(m - m_new), jnp.exp(s - m_new)
        return m_new, alpha * denom + jnp.sum(p, axis=1, keepdims=True), alpha * acc + _dot(p, vb)

    carry = (jnp.full((tile, 1), _NEG_BIG, jnp.float32), jnp.zeros((tile, 1), jnp.float32),
             jnp.zeros(q.shape, jnp.float32))
    carry = jax.lax.fori_loop(0, i + 1, seq_step, carry)

    qd = qd_ref[...].astype(jnp.float32) * scale
    for valid_ref, kd_ref, vd_ref in zip(valids, kds, vds, strict=True):
        def depth_step(s, carry, valid_ref=valid_ref, kd_ref=kd_ref, vd_ref=vd_ref):
            m, denom, acc = carry
            logit = jnp.sum(qd * _slot(kd_ref, s), axis=1, keepdims=True)
            logit = jnp.where(valid_ref[s] > 0, logit, -jnp.inf)
            m_new = jnp.maximum(m, logit)
            alpha, p = jnp.exp(m - m_new), jnp.exp(logit - m_new)
            return m_new, alpha * denom + p, alpha * acc + p * _slot(vd_ref, s)

        carry = jax.lax.fori_loop(0, kd_ref.shape[1], depth_step, carry)
    m, denom, acc = carry
    o_ref[...] = (acc / denom).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(denom)


def _bwd_dq_kernel(*refs, n_groups: int, tile: int, scale: float):
    (valids, q_ref, k_ref, v_ref, qd_ref, kds, vds, do_ref, lse_ref, delta_ref,
     dq_ref, dqd_ref) = _split(refs, n_groups, (None, 1, 1, 1, 1, None, None, 1, 1, 1, 1, 1))
    i = pl.program_id(2)
    q = q_ref[...].astype(jnp.float32) * scale
    do = do_ref[...].astype(jnp.float32)
    lse, delta = lse_ref[...], delta_ref[...]

    def seq_step(j, dq):
        kb, vb = _rows(k_ref, j, tile), _rows(v_ref, j, tile)
        p = jnp.where(_causal(i, j, tile), jnp.exp(_dot_t(q, kb) - lse), 0.0)
        ds = p * (_dot_t(do, vb) - delta)
        return dq + _dot(ds, kb)

    dq = jax.lax.fori_loop(0, i + 1, seq_step, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)

    qd = qd_ref[...].astype(jnp.float32) * scale
    dqd = jnp.zeros(q.shape, jnp.float32)
    for valid_ref, kd_ref, vd_ref in zip(valids, kds, vds, strict=True):
        def depth_step(s, dqd, valid_ref=valid_ref, kd_ref=kd_ref, vd_ref=vd_ref):
            kd = _slot(kd_ref, s)
            logit = jnp.sum(qd * kd, axis=1, keepdims=True)
            p = jnp.where(valid_ref[s] > 0, jnp.exp(logit - lse), 0.0)
            ds = p * (jnp.sum(do * _slot(vd_ref, s), axis=1, keepdims=True) - delta)
            return dqd + ds * kd

        dqd = jax.lax.fori_loop(0, kd_ref.shape[1], depth_step, dqd)
    dqd_ref[...] = (dqd * scale).astype(dqd_ref.dtype)


def _bwd_dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *,
                    tile: int, scale: float):
    j = pl.program_id(2)
    kb, vb = k_ref[...].astype(jnp.float32), v_ref[...].astype(jnp.float32)

    def step(i, carry):
        dk, dv = carry
        q = _rows(q_ref, i, tile) * scale
        do = _rows(do_ref, i, tile)
        lse, delta = _rows(lse_ref, i, tile), _rows(delta_ref, i, tile)
        p = jnp.where(_causal(i, j, tile), jnp.exp(_dot_t(q, kb) - lse), 0.0)
        ds = p * (_dot_t(do, vb) - delta)
        return dk + _tdot(ds, q), dv + _tdot(p, do)

    zeros = jnp.zeros(kb.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(j, q_ref.shape[0] // tile, step, (zeros, zeros))
    dk_ref[...] = dk
    dv_ref[...] = dv


def _bwd_depth_kernel(valid_ref, qd_ref, do_ref, lse_ref, delta_ref, kd_ref, vd_ref,
                      dkd_ref, dvd_ref, *, scale: float):
    heads = qd_ref.shape[0]  # the query heads of this depth key head

    def step(s, _):
        kd, vd = _slot(kd_ref, s), _slot(vd_ref, s)
        dk = jnp.zeros(kd.shape, jnp.float32)
        dv = jnp.zeros(kd.shape, jnp.float32)
        for h in range(heads):
            qd = qd_ref[h].astype(jnp.float32) * scale
            do = do_ref[h].astype(jnp.float32)
            logit = jnp.sum(qd * kd, axis=1, keepdims=True)
            p = jnp.where(valid_ref[s] > 0, jnp.exp(logit - lse_ref[h]), 0.0)
            ds = p * (jnp.sum(do * vd, axis=1, keepdims=True) - delta_ref[h])
            dk, dv = dk + ds * qd, dv + p * do
        dkd_ref[:, s, :] = dk.astype(dkd_ref.dtype)
        dvd_ref[:, s, :] = dv.astype(dvd_ref.dtype)
        return 0

    jax.lax.fori_loop(0, kd_ref.shape[1], step, 0)


# ---------------------------------------------------------------- pallas calls
def _div(h, r: int):
    """Key head of query head ``h`` in an index map (``lax.div``: Mosaic lowers no
    floor division's sign test on a machine without a TPU)."""
    return jax.lax.div(h, jnp.int32(r))


def _valid_spec(target: Target, m: int):
    if target.kind == "tpu" and not target.interpret:
        from jax.experimental.pallas import tpu as pltpu

        return pl.BlockSpec(memory_space=pltpu.SMEM)
    return pl.BlockSpec((m,), lambda *_: (0,))


def _query_specs(target, cfg, q_shape, kv_heads, depth_heads):
    """Block specs of the query-tile grid ``(B, N, T / tile)``."""
    _, n, t_pad, width = q_shape
    tile, ms = cfg.tile, cfg.slots
    tok = pl.BlockSpec((None, None, tile, width), lambda b, h, i: (b, h, i, 0))
    stat = pl.BlockSpec((None, None, tile, 1), lambda b, h, i: (b, h, i, 0))
    seq = pl.BlockSpec((None, None, t_pad, width),
                       lambda b, h, i: (b, _div(h, n // kv_heads), 0, 0))

    def depth(g, m):
        return pl.BlockSpec((None, tile, None, m, width),
                            lambda b, h, i: (b, i, _div(h, n // g), 0, 0))

    deps = [depth(g, m) for g, m in zip(depth_heads, ms, strict=True)]
    return [_valid_spec(target, m) for m in ms], tok, stat, seq, deps


class _Cfg:
    """Static configuration of one call (hashable: a custom_vjp nondiff argument)."""

    def __init__(self, target: Target, tile: int, scale: float, slots: tuple[int, ...]):
        self.target, self.tile, self.scale, self.slots = target, tile, scale, slots

    def _key(self):
        return (self.target, self.tile, self.scale, self.slots)

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, _Cfg) and self._key() == other._key()


def _fwd_call(cfg: _Cfg, q, k, v, qd, kds, vds, valids):
    b, n, t_pad, width = q.shape
    groups = len(kds)
    vsp, tok, stat, seq, deps = _query_specs(cfg.target, cfg, q.shape, k.shape[1],
                                             [x.shape[2] for x in kds])
    return cfg.target.pallas_call(
        functools.partial(_fwd_kernel, n_groups=groups, tile=cfg.tile, scale=cfg.scale),
        grid=(b, n, t_pad // cfg.tile),
        in_specs=[*vsp, tok, seq, seq, tok, *deps, *deps],
        out_specs=[tok, stat],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((b, n, t_pad, 1), jnp.float32)],
        name="moda_attention_fwd",
    )(*valids, q, k, v, qd, *kds, *vds)


def _bwd_dq_call(cfg: _Cfg, q, k, v, qd, kds, vds, valids, do, lse, delta):
    b, n, t_pad, _ = q.shape
    vsp, tok, stat, seq, deps = _query_specs(cfg.target, cfg, q.shape, k.shape[1],
                                             [x.shape[2] for x in kds])
    return cfg.target.pallas_call(
        functools.partial(_bwd_dq_kernel, n_groups=len(kds), tile=cfg.tile, scale=cfg.scale),
        grid=(b, n, t_pad // cfg.tile),
        in_specs=[*vsp, tok, seq, seq, tok, *deps, *deps, tok, stat, stat],
        out_specs=[tok, tok],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct(qd.shape, qd.dtype)],
        name="moda_attention_bwd_dq",
    )(*valids, q, k, v, qd, *kds, *vds, do, lse, delta)


def _bwd_dkv_call(cfg: _Cfg, q, k, v, do, lse, delta):
    """Per query head: its share of ``dk, dv`` ``[B, N, T, d]`` (fp32)."""
    b, n, t_pad, width = q.shape
    tile, kv = cfg.tile, k.shape[1]
    whole = pl.BlockSpec((None, None, t_pad, width), lambda b, h, j: (b, h, 0, 0))
    whole_stat = pl.BlockSpec((None, None, t_pad, 1), lambda b, h, j: (b, h, 0, 0))
    key = pl.BlockSpec((None, None, tile, width), lambda b, h, j: (b, _div(h, n // kv), j, 0))
    out = pl.BlockSpec((None, None, tile, width), lambda b, h, j: (b, h, j, 0))
    return cfg.target.pallas_call(
        functools.partial(_bwd_dkv_kernel, tile=tile, scale=cfg.scale),
        grid=(b, n, t_pad // tile),
        in_specs=[whole, key, key, whole, whole_stat, whole_stat],
        out_specs=[out, out],
        out_shape=[jax.ShapeDtypeStruct(q.shape, jnp.float32)] * 2,
        name="moda_attention_bwd_dkv",
    )(q, k, v, do, lse, delta)


def _bwd_depth_call(cfg: _Cfg, qd, kd, vd, valid, do, lse, delta):
    """One depth group's ``dkd, dvd`` in its cache layout and dtype."""
    b, n, t_pad, width = qd.shape
    tile, g, m = cfg.tile, kd.shape[2], kd.shape[3]
    r = n // g
    heads = pl.BlockSpec((None, r, tile, width), lambda b, c, i: (b, c, i, 0))
    heads_stat = pl.BlockSpec((None, r, tile, 1), lambda b, c, i: (b, c, i, 0))
    cache = pl.BlockSpec((None, tile, None, m, width), lambda b, c, i: (b, i, c, 0, 0))
    return cfg.target.pallas_call(
        functools.partial(_bwd_depth_kernel, scale=cfg.scale),
        grid=(b, g, t_pad // tile),
        in_specs=[_valid_spec(cfg.target, m), heads, heads, heads_stat, heads_stat, cache, cache],
        out_specs=[cache, cache],
        out_shape=[jax.ShapeDtypeStruct(kd.shape, kd.dtype),
                   jax.ShapeDtypeStruct(vd.shape, vd.dtype)],
        name="moda_attention_bwd_depth",
    )(valid, qd, do, lse, delta, kd, vd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(cfg, q, k, v, qd, kds, vds, valids):
    return _fwd_call(cfg, q, k, v, qd, kds, vds, valids)[0]


def _fused_fwd(cfg, q, k, v, qd, kds, vds, valids):
    out, lse = _fwd_call(cfg, q, k, v, qd, kds, vds, valids)
    return out, (q, k, v, qd, kds, vds, valids, out, lse)


def _fused_bwd(cfg, res, do):
    q, k, v, qd, kds, vds, valids, out, lse = res
    delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    dq, dqd = _bwd_dq_call(cfg, q, k, v, qd, kds, vds, valids, do, lse, delta)
    dk_n, dv_n = _bwd_dkv_call(cfg, q, k, v, do, lse, delta)
    b, n, t_pad, width = q.shape
    kv = k.shape[1]

    def per_key_head(x, like):
        return x.reshape(b, kv, n // kv, t_pad, width).sum(axis=2).astype(like.dtype)

    depth = [_bwd_depth_call(cfg, qd, kd, vd, valid, do, lse, delta)
             for kd, vd, valid in zip(kds, vds, valids, strict=True)]
    return (dq, per_key_head(dk_n, k), per_key_head(dv_n, v), dqd,
            tuple(d[0] for d in depth), tuple(d[1] for d in depth), tuple(None for _ in valids))


_fused.defvjp(_fused_fwd, _fused_bwd)
_entry = lowered_once(_fused)


# ---------------------------------------------------------------- entry point
def query_tile(target: Target, n_tok: int) -> int:
    """Tokens per query (and key) tile: TPU a multiple of 8 up to 128; GPU a
    power of two in [16, 64] (``tl.dot``'s minimum; what the original uses)."""
    if target.kind == "tpu":
        return min(128, round_up(n_tok, 8))
    return min(64, max(16, pl.next_power_of_2(n_tok)))


def head_width(target: Target, d: int) -> int:
    return max(16, target.width(d)) if target.pow2 else d


def moda_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array,
                   q_depth_btnh: jax.Array, groups, backend: str | Target | None = "auto"
                   ) -> jax.Array:
    """Fused :func:`moda_attention_reference`: ``q, qd [B, T, N, d_h]``, ``k, v
    [B, T, K, d_h]``, ``groups`` a sequence of ``(kd, vd [B, T, g, m, d_h],
    valid [m])``; returns ``[B, T, N, d_h]`` in ``q``'s dtype.

    Differentiable in ``q, k, v, qd`` and every group's ``kd, vd`` (not in
    ``valid``).  ``K`` and each ``g`` must divide ``N``."""
    target = resolve(backend)
    b, t, n, h = q_btnh.shape
    groups = [(kd, vd, valid) for kd, vd, valid in groups if kd.shape[3] > 0]
    for heads in [k_btkh.shape[2], *(kd.shape[2] for kd, _, _ in groups)]:
        if n % heads:
            raise ValueError(f"moda_attention: {heads} key heads do not divide {n} query heads")
    tile = query_tile(target, t)
    t_pad, width = round_up(t, tile), head_width(target, h)

    def heads_first(x):  # [B, T, heads, h] -> [B, heads, T_pad, width]
        return pad_axis(pad_axis(x.transpose(0, 2, 1, 3), 2, t_pad), 3, width)

    def cache(x):  # [B, T, g, m, h], padded in place (no copy when it fits)
        return pad_axis(pad_axis(x, 1, t_pad), 4, width)

    cfg = _Cfg(target, tile, 1.0 / math.sqrt(h), tuple(kd.shape[3] for kd, _, _ in groups))
    out = _entry(cfg, heads_first(q_btnh), heads_first(k_btkh), heads_first(v_btkh),
                 heads_first(q_depth_btnh), tuple(cache(kd) for kd, _, _ in groups),
                 tuple(cache(vd) for _, vd, _ in groups),
                 tuple(valid.astype(jnp.int32) for _, _, valid in groups))
    return out[:, :, :t, :h].transpose(0, 2, 1, 3)
