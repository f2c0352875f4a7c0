"""Backbone sublayers: RMSNorm, RoPE, causal (GQA) attention, SwiGLU MLP.

Every parameter carries logical axis names (mapped to mesh axes by
``depthbench.parallel``); every weight is truncated normal (std 0.02, cut at
+-3 std) times a per-matrix scale that residual families may set (DeepNorm's
beta, hyper-connections' 1/sqrt(n)).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn

from depthbench.model.past_attention import PastKeys, merge_parts, past_part
from depthbench.model.residual.protocol.base import (
    BTD,
    keep_for_backward,
    norm_param,
    rms_norm,
    with_axes,
)
from depthbench.model.spec import ModelSpec


def trunc_normal(std: float, cutoff: float = 3.0):
    """Truncated normal with the given std before truncation, cut at +-cutoff std."""

    def init(key, shape, dtype=jnp.float32):
        return (jax.random.truncated_normal(key, -cutoff, cutoff, shape, jnp.float32) * std).astype(
            dtype
        )

    return init


def weight(
    mod: nn.Module,
    name: str,
    shape: tuple[int, ...],
    axes: tuple[str, ...],
    spec: ModelSpec,
    scale: float = 1.0,
) -> jax.Array:
    """A backbone matrix: truncated-normal init, logical axes, param dtype."""
    init = nn.with_logical_partitioning(trunc_normal(spec.init_std * scale), axes)
    return mod.param(name, init, shape, spec.pdtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learned weight (init 1); statistics in fp32."""

    spec: ModelSpec

    @nn.compact
    def __call__(self, x: jax.Array, eps: float | None = None) -> jax.Array:
        """``eps``: the family's, where it is not ``norm_eps`` (attnres's readout)."""
        w = norm_param(self, "scale", self.spec.d_model, self.spec.pdtype)
        return rms_norm(x, w, self.spec.norm_eps if eps is None else eps)


def project(x: jax.Array, w: jax.Array, in_dims: int = 1) -> jax.Array:
    """``x @ w`` contracting x's last ``in_dims`` dims with w's first, as one 2-D matmul.

    ``x`` is ``[*lead, *w.shape[:in_dims]]``; the result is
    ``[*lead, *w.shape[in_dims:]]``.  Same product as the einsum
    (``btd,dnh->btnh``), but the leading dims are flattened first, so the
    weight gradient autodiff writes is a plain 2-D ``x^T g`` contracting the
    token dim of both operands.  Given the 3-D form, XLA:CPU's dot
    canonicalisation copies one activation-sized operand into a transposed
    layout for every weight gradient (about a quarter of a CPU step's time,
    README "Performance"); in 2-D it runs the transposed product directly.
    """
    lead = x.shape[: x.ndim - in_dims]
    k = math.prod(w.shape[:in_dims])
    y = x.reshape(math.prod(lead), k) @ w.reshape(k, -1)
    return y.reshape(*lead, *w.shape[in_dims:])


def rope(x_bthd: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding (rotate-half convention), computed in fp32.

    ``positions`` is ``[T]`` (every row alike) or ``[B, T]`` (a decode step:
    each row at its own position); a token's angles are the same either way."""
    half = x_bthd.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions.astype(jnp.float32)[..., None] * freq  # [(B,) T, half]
    sin = jnp.sin(angle)[..., None, :]  # a heads axis to broadcast over
    cos = jnp.cos(angle)[..., None, :]
    x = x_bthd.astype(jnp.float32)
    x1, x2 = x[..., :half], x[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_bthd.dtype)


CAUSAL_BLOCK = 64  # query rows per block of causal_attention, at least
MAX_CAUSAL_BLOCKS = 8  # blocks per sequence, at most (each is unrolled, forward and backward)


def query_blocks(t: int) -> int:
    """Causal query blocks over ``t`` tokens: the most blocks, at most
    ``MAX_CAUSAL_BLOCKS``, that split ``t`` evenly into blocks of at least
    ``CAUSAL_BLOCK`` rows; 1 when none does (T 128: 2, T 256: 4, T 512 and
    longer: 8).  Smaller blocks skip more of the masked triangle (``(nb + 1) /
    2 nb`` of the full products) but make smaller matmuls; 64-row blocks made
    the CPU step no slower than 128-row ones, and faster at T 128
    (bench/results/cpu_step.md, "Causal blocks")."""
    fits = [nb for nb in range(1, MAX_CAUSAL_BLOCKS + 1)
            if t % nb == 0 and t // nb >= CAUSAL_BLOCK]
    return max(fits, default=1)


def causal_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array,
                     segments_bt: jax.Array | None = None) -> jax.Array:
    """softmax(q k^T / sqrt(d_h) + causal mask) v, GQA by grouping query heads.

    ``segments_bt`` (packed rows: one id per document): a query sees only the
    earlier keys of its own segment.

    Query head ``i`` uses key head ``i // (n / k)`` (as in
    ``jax.nn.dot_product_attention``).  Written out rather than calling
    ``jax.nn.dot_product_attention``, whose XLA path repeats the key heads;
    three choices make it faster on CPU than the einsum form, more so the
    longer the sequence (bench/results/code_notes.md; bench/peer.py for the
    whole step):

    * **layout**: the products are plain batched matmuls over ``[B, K, M,
      H]``, the ``G = n / k`` query heads of a key head stacked along the rows;
      queries, keys and values are transposed once into that layout (``O(B T
      d)`` copies), where the 4-D/5-D einsum forms make XLA:CPU copy
      ``[.., T, T]`` operands into transposed layouts in the backward;
    * **causal blocks** (:func:`query_blocks`): query block ``i`` is
      multiplied by keys ``[0, (i + 1) blk)`` only, so the blocks
      above the diagonal are never computed (``(nb + 1) / 2 nb`` of the full
      products: 56% at T 512 in 8 blocks); each row's softmax still sees
      every key it may see;
    * **backward from statistics** (:func:`causal_blocks`): only the output
      and each row's log-sum-exp are kept, the probabilities are recomputed.

    The query is scaled before the product; logits and softmax are fp32.
    """
    t, h = q_btnh.shape[1], q_btnh.shape[3]
    kv = k_btkh.shape[2]
    nb = query_blocks(t)
    q_bkqmh = heads_to_rows(q_btnh * jnp.asarray(h ** -0.5, q_btnh.dtype), kv, nb)
    out_bkqmh, _ = causal_blocks(q_bkqmh, k_btkh.transpose(0, 2, 1, 3),
                                  v_btkh.transpose(0, 2, 1, 3), segments_bt)
    return rows_to_heads(out_bkqmh, t)


def causal_part(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array,
                segments_bt: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Causal attention of already scaled queries over their own tokens, with
    each row's log-sum-exp: ``(out [B, T, N, H], lse [B, T, N])``, the part
    :func:`~depthbench.model.past_attention.merge_parts` joins with others
    (cached keys, moda's depth keys).  :func:`causal_attention`'s blocks and
    backward; fp32 when its inputs are."""
    t, kv = q_btnh.shape[1], k_btkh.shape[2]
    q_bkqmh = heads_to_rows(q_btnh, kv, query_blocks(t))
    out_bkqmh, lse_bkqm = causal_blocks(q_bkqmh, k_btkh.transpose(0, 2, 1, 3),
                                        v_btkh.transpose(0, 2, 1, 3), segments_bt)
    return rows_to_heads(out_bkqmh, t), rows_to_heads(lse_bkqm[..., None], t)[..., 0]


def attention_with_past(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array,
                        past: PastKeys) -> jax.Array:
    """Attention of new tokens (rotated queries, keys, values ``[B, T, *, H]``) over
    themselves, causally, and over the cached keys of earlier positions: one
    softmax in fp32, in two parts merged by their log-sum-exps."""
    scale = 1.0 / jnp.sqrt(jnp.float32(q_btnh.shape[-1]))
    q = q_btnh.astype(jnp.float32) * scale
    parts = [causal_part(q, k_btkh.astype(jnp.float32), v_btkh.astype(jnp.float32)),
             past_part(q, past)]
    return merge_parts(parts).astype(q_btnh.dtype)


def heads_to_rows(x_btnh: jax.Array, kv: int, nb: int = 1) -> jax.Array:
    """``[B, T, N, H]`` -> ``[B, K, nb, G * T / nb, H]``: per key head and query
    block of ``T / nb`` tokens, the ``G = N / K`` query heads stacked along the
    rows (row ``m`` is head ``m // (T / nb)``, token ``m % (T / nb)`` of the block)."""
    b, t, n, h = x_btnh.shape
    g, blk = n // kv, t // nb
    x = x_btnh.reshape(b, nb, blk, kv, g, h).transpose(0, 3, 1, 4, 2, 5)
    return x.reshape(b, kv, nb, g * blk, h)


def rows_to_heads(x_bkqmh: jax.Array, t: int) -> jax.Array:
    """The inverse of :func:`heads_to_rows`: ``[B, K, nb, G * T / nb, H]`` -> ``[B, T, N, H]``."""
    b, kv, nb, m, h = x_bkqmh.shape
    g = m * nb // t
    x = x_bkqmh.reshape(b, kv, nb, g, t // nb, h).transpose(0, 2, 4, 1, 3, 5)
    return x.reshape(b, t, kv * g, h)


def _block_logits(q_bkmh, k_bksh, i, blk, segments_bt=None):
    """Masked fp32 logits of query block ``i`` (``blk`` tokens) against the
    keys it may see, ``[0, (i + 1) blk)`` (with ``segments_bt``: of its segment).

    Row ``m`` of the block is query token ``i * blk + m % blk`` (the ``G``
    heads of a key head are stacked along the rows); masked logits are the
    most negative finite float, so their ``exp`` is exactly 0."""
    keys = (i + 1) * blk
    logits_bkms = jnp.einsum("bkmh,bksh->bkms", q_bkmh, k_bksh[:, :, :keys],
                             preferred_element_type=jnp.float32)
    rows_m = i * blk + jnp.arange(q_bkmh.shape[2]) % blk
    causal_ms = jnp.arange(keys)[None, :] <= rows_m[:, None]
    if segments_bt is not None:  # a packed row: no key of another document
        same_bms = segments_bt[:, rows_m, None] == segments_bt[:, None, :keys]
        causal_ms = causal_ms & same_bms[:, None]
    return jnp.where(causal_ms, logits_bkms, jnp.finfo(jnp.float32).min), keys


@jax.custom_vjp
def causal_blocks(q_bkqmh, k_bksh, v_bksh, segments_bt=None):
    """Causal softmax attention per query block; ``q_bkqmh`` is ``[B, K, nb, M, H]``;
    ``segments_bt``: document ids of a packed row (None: one document).
    Returns the output and each row's log-sum-exp ``[B, K, nb, M]`` (fp32;
    moda's joint softmax, ``residual/parts/moda_attention.py``, merges more keys into
    it with that).

    Forward per block: ``mu = max l``, ``p = e^(l - mu) / sum``, ``o = p v``,
    and the row statistic ``lse = mu + log sum e^(l - mu)``.  Backward (the
    flash-attention form) from ``q, k, v, o, lse`` alone::

        p  = e^(l - lse)                 (recomputed; masked entries 0)
        dv = p^T do      dp = do v^T      D = rowsum(do * o) - dlse
        ds = p (dp - D)  dq = ds k        dk = ds^T q

    (``d lse / d l = p``), so the layer scan stacks no ``[.., T, T]`` tensor
    for the backward."""
    return _causal_blocks_fwd(q_bkqmh, k_bksh, v_bksh, segments_bt)[0]


def _causal_blocks_fwd(q_bkqmh, k_bksh, v_bksh, segments_bt=None):
    nb = q_bkqmh.shape[2]
    outs, lses = [], []
    for i in range(nb):
        logits_bkms, keys = _block_logits(q_bkqmh[:, :, i], k_bksh, i, k_bksh.shape[2] // nb,
                                          segments_bt)
        mu_bkm = jnp.max(logits_bkms, axis=-1, keepdims=True)
        e_bkms = jnp.exp(logits_bkms - mu_bkm)
        sum_bkm = jnp.sum(e_bkms, axis=-1, keepdims=True)
        probs_bkms = (e_bkms / sum_bkm).astype(v_bksh.dtype)
        outs.append(jnp.einsum("bkms,bksh->bkmh", probs_bkms, v_bksh[:, :, :keys]))
        lses.append((mu_bkm + jnp.log(sum_bkm))[..., 0])
    # Kept under matmuls_saveable: recomputing them would rerun the forward's
    # batched products; the backward needs only these and q, k, v.
    out_bkqmh = keep_for_backward(jnp.stack(outs, axis=2))
    lse_bkqm = keep_for_backward(jnp.stack(lses, axis=2))
    return (out_bkqmh, lse_bkqm), (q_bkqmh, k_bksh, v_bksh, out_bkqmh, lse_bkqm, segments_bt)


def _causal_blocks_bwd(saved, cts):
    q_bkqmh, k_bksh, v_bksh, out_bkqmh, lse_bkqm, segments_bt = saved
    dout_bkqmh, dlse_bkqm = cts
    dk_bksh = jnp.zeros(k_bksh.shape, jnp.float32)
    dv_bksh = jnp.zeros(v_bksh.shape, jnp.float32)
    nb = q_bkqmh.shape[2]
    dqs = []
    for i in range(nb):
        q_bkmh, dout_bkmh = q_bkqmh[:, :, i], dout_bkqmh[:, :, i]
        logits_bkms, keys = _block_logits(q_bkmh, k_bksh, i, k_bksh.shape[2] // nb, segments_bt)
        probs_bkms = jnp.exp(logits_bkms - lse_bkqm[:, :, i, :, None])
        dv_bksh = dv_bksh.at[:, :, :keys].add(jnp.einsum(
            "bkms,bkmh->bksh", probs_bkms.astype(v_bksh.dtype), dout_bkmh,
            preferred_element_type=jnp.float32))
        dp_bkms = jnp.einsum("bkmh,bksh->bkms", dout_bkmh, v_bksh[:, :, :keys],
                             preferred_element_type=jnp.float32)
        rowdot_bkm = jnp.sum(dout_bkmh.astype(jnp.float32) * out_bkqmh[:, :, i].astype(
            jnp.float32), axis=-1, keepdims=True) - dlse_bkqm[:, :, i, :, None]
        ds_bkms = (probs_bkms * (dp_bkms - rowdot_bkm)).astype(q_bkqmh.dtype)
        dqs.append(jnp.einsum("bkms,bksh->bkmh", ds_bkms, k_bksh[:, :, :keys]))
        dk_bksh = dk_bksh.at[:, :, :keys].add(jnp.einsum(
            "bkms,bkmh->bksh", ds_bkms, q_bkmh, preferred_element_type=jnp.float32))
    return (jnp.stack(dqs, axis=2).astype(q_bkqmh.dtype), dk_bksh.astype(k_bksh.dtype),
            dv_bksh.astype(v_bksh.dtype), None)  # document ids: no cotangent


causal_blocks.defvjp(_causal_blocks_fwd, _causal_blocks_bwd)


class AttentionKeys(NamedTuple):
    """What an attention sublayer's tokens offer as keys: ``k``, ``v`` before RoPE
    (mixture-of-depths attention stores them as depth keys) and the rotated
    ``k_rot`` (a decoder caches it with ``v``), each ``[B, T, K, H]``."""

    k: jax.Array
    v: jax.Array
    k_rot: jax.Array


class Attention(nn.Module):
    """Causal multi-head attention with RoPE and optional GQA.

    Returns the output and the tokens' :class:`AttentionKeys`.  ``positions`` is
    ``[T]`` or, in a decode step or a packed row, ``[B, T]``; ``past``
    (:class:`PastKeys`) the keys of earlier positions the tokens also see (a
    decoder's cache); ``segments`` ``[B, T]`` the document of each token of a
    packed row (a token sees only its own document's keys).
    ``attend(q, q_rot, k_rot, v, past, segments)``, when given, replaces the
    softmax (a family's ``capabilities.DepthAttention``: moda's joint softmax
    over sequence and depth keys).
    """

    spec: ModelSpec
    scales: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)  # q, k, v, o

    @nn.compact
    def __call__(self, x_btd, positions, attend=None, past: PastKeys | None = None,
                 segments=None):
        s = self.spec
        d, n, kv, h = s.d_model, s.n_heads, s.n_kv_heads, s.head_dim
        sq, sk, sv, so = self.scales
        wq = weight(self, "q", (d, n, h), ("embed", "heads", "head_dim"), s, sq)
        wk = weight(self, "k", (d, kv, h), ("embed", "kv_heads", "head_dim"), s, sk)
        wv = weight(self, "v", (d, kv, h), ("embed", "kv_heads", "head_dim"), s, sv)
        wo = weight(self, "o", (n, h, d), ("heads", "head_dim", "embed"), s, so)
        x = x_btd.astype(s.dtype)
        q = project(x, wq.astype(s.dtype))
        k = project(x, wk.astype(s.dtype))
        v = project(x, wv.astype(s.dtype))
        q = with_axes(q, ("activation_batch", "activation_length", "activation_heads", None))
        k = with_axes(k, ("activation_batch", "activation_length", "activation_kv_heads", None))
        qr, kr = rope(q, positions, s.rope_theta), rope(k, positions, s.rope_theta)
        if attend is not None:
            out = attend(q, qr, kr, v, past, segments)
        elif past is not None:
            out = attention_with_past(qr, kr, v, past)
        elif s.attention_impl == "xla":
            out = causal_attention(qr, kr, v, segments)
        elif segments is not None:
            raise ValueError(f"attention_impl={s.attention_impl!r} takes no document ids "
                             "(packed rows): use 'xla'")
        else:  # a fused kernel jax provides ("cudnn")
            out = jax.nn.dot_product_attention(
                qr, kr, v, is_causal=True, implementation=s.attention_impl)
        y = project(out, wo.astype(s.dtype), in_dims=2)
        return with_axes(y, BTD), AttentionKeys(k, v, kr)


MLP_AXES = ("activation_batch", "activation_length", "activation_mlp")


@jax.custom_vjp
def swiglu(x_btd: jax.Array, wg_df: jax.Array, wu_df: jax.Array, wd_fd: jax.Array) -> jax.Array:
    """SwiGLU, ``down(silu(x W_g) * (x W_u))``, keeping only ``x``, ``x W_g`` and
    ``x W_u`` for the backward.

    Autodiff of the same expression keeps six ``[B*T, d_ff]`` tensors per
    block (the activation's pieces and the hidden product); under the layer
    scan each is a stacked buffer the forward fills and the backward reads.
    Here the backward recomputes ``sigma = sigmoid(g)``, ``a = g sigma`` and
    ``h = a u`` (elementwise, cheap) and applies::

        dh = dy W_d^T        dW_d = h^T dy
        du = dh a            dg   = dh u sigma (1 + g (1 - sigma))
        dx = dg W_g^T + du W_u^T,   dW_g = x^T dg,   dW_u = x^T du

    All products are 2-D (see :func:`project`).
    """
    return _swiglu_fwd(x_btd, wg_df, wu_df, wd_fd)[0]


def _swiglu_fwd(x_btd, wg_df, wu_df, wd_fd):
    lead = x_btd.shape[:-1]
    x_nd = x_btd.reshape(-1, x_btd.shape[-1])
    gate_nf = x_nd @ wg_df
    up_nf = x_nd @ wu_df
    hidden = with_axes((jax.nn.silu(gate_nf) * up_nf).reshape(*lead, -1), MLP_AXES)
    y_nd = hidden.reshape(x_nd.shape[0], -1) @ wd_fd
    return y_nd.reshape(*lead, -1), (x_nd, gate_nf, up_nf, wg_df, wu_df, wd_fd)


def _swiglu_bwd(saved, dy_btd):
    x_nd, gate_nf, up_nf, wg_df, wu_df, wd_fd = saved
    dy_nd = dy_btd.reshape(x_nd.shape[0], -1)
    sigma_nf = jax.nn.sigmoid(gate_nf)
    act_nf = gate_nf * sigma_nf
    d_hidden_nf = dy_nd @ wd_fd.T
    d_wd = jnp.einsum("nf,nd->fd", act_nf * up_nf, dy_nd)
    d_up_nf = d_hidden_nf * act_nf
    d_gate_nf = d_hidden_nf * up_nf * sigma_nf * (1 + gate_nf * (1 - sigma_nf))
    dx_nd = d_gate_nf @ wg_df.T + d_up_nf @ wu_df.T
    d_wg = jnp.einsum("nd,nf->df", x_nd, d_gate_nf)
    d_wu = jnp.einsum("nd,nf->df", x_nd, d_up_nf)
    return (dx_nd.reshape(dy_btd.shape[:-1] + (x_nd.shape[1],)).astype(x_nd.dtype),
            d_wg.astype(wg_df.dtype), d_wu.astype(wu_df.dtype), d_wd.astype(wd_fd.dtype))


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (:func:`swiglu`)."""

    spec: ModelSpec
    scales: tuple[float, float, float] = (1.0, 1.0, 1.0)  # gate, up, down

    @nn.compact
    def __call__(self, x_btd):
        s = self.spec
        sg, su, sd = self.scales
        wg = weight(self, "gate", (s.d_model, s.d_ff), ("embed", "mlp"), s, sg)
        wu = weight(self, "up", (s.d_model, s.d_ff), ("embed", "mlp"), s, su)
        wd = weight(self, "down", (s.d_ff, s.d_model), ("mlp", "embed"), s, sd)
        x = x_btd.astype(s.dtype)
        y = swiglu(x, wg.astype(s.dtype), wu.astype(s.dtype), wd.astype(s.dtype))
        return with_axes(y, BTD)
