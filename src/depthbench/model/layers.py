"""Backbone sublayers: RMSNorm, RoPE, causal (GQA) attention, SwiGLU MLP.

Every parameter carries logical axis names (mapped to mesh axes by
``depthbench.parallel``); every weight is truncated normal (std 0.02, cut at
+-3 std) times a per-matrix scale that residual families may set (DeepNorm's
beta, hyper-connections' 1/sqrt(n)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from depthbench.model.residual.base import BTD, norm_param, rms_norm, with_axes
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
    def __call__(self, x: jax.Array) -> jax.Array:
        w = norm_param(self, "scale", self.spec.d_model)
        return rms_norm(x, w, self.spec.norm_eps)


def rope(x_bthd: jax.Array, positions_t: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding (rotate-half convention), computed in fp32."""
    half = x_bthd.shape[-1] // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle_th = positions_t.astype(jnp.float32)[:, None] * freq[None, :]
    sin = jnp.sin(angle_th)[None, :, None, :]
    cos = jnp.cos(angle_th)[None, :, None, :]
    x = x_bthd.astype(jnp.float32)
    x1, x2 = x[..., :half], x[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_bthd.dtype)


def attention_with_depth(
    q_btnh, k_btkh, v_btkh, q_raw_btnh, depth_k_btmkh, depth_v_btmkh, depth_valid_m
):
    """Causal attention whose softmax also covers depth keys at the same token.

    Sequence logits use rotated q, k; depth logits use the unrotated query
    (RoPE cancels at equal positions).  One softmax over both, in fp32.
    """
    b, t, n, h = q_btnh.shape
    kv = k_btkh.shape[2]
    g = n // kv
    scale = 1.0 / jnp.sqrt(jnp.float32(h))
    q = q_btnh.reshape(b, t, kv, g, h).astype(jnp.float32)
    qr = q_raw_btnh.reshape(b, t, kv, g, h).astype(jnp.float32)
    seq_logits = jnp.einsum("btkgh,bskh->bkgts", q, k_btkh.astype(jnp.float32)) * scale
    causal_ts = jnp.tril(jnp.ones((t, t), dtype=bool))
    seq_logits = jnp.where(causal_ts, seq_logits, -jnp.inf)
    depth_logits = jnp.einsum("btkgh,btmkh->bkgtm", qr, depth_k_btmkh.astype(jnp.float32)) * scale
    depth_logits = jnp.where(depth_valid_m, depth_logits, -jnp.inf)
    logits = jnp.concatenate([seq_logits, depth_logits], axis=-1)
    probs = jax.nn.softmax(logits, axis=-1)
    p_seq, p_depth = probs[..., :t], probs[..., t:]
    out = jnp.einsum("bkgts,bskh->btkgh", p_seq, v_btkh.astype(jnp.float32))
    out = out + jnp.einsum("bkgtm,btmkh->btkgh", p_depth, depth_v_btmkh.astype(jnp.float32))
    return out.reshape(b, t, n, h).astype(q_btnh.dtype)


class Attention(nn.Module):
    """Causal multi-head attention with RoPE and optional GQA.

    Returns the output and the pre-RoPE ``(k, v)`` (mixture-of-depths
    attention stores them as depth keys).  ``depth_kv`` adds depth keys to the
    softmax (see :func:`attention_with_depth`).
    """

    spec: ModelSpec
    scales: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)  # q, k, v, o

    @nn.compact
    def __call__(self, x_btd, positions_t, depth_kv=None):
        s = self.spec
        d, n, kv, h = s.d_model, s.n_heads, s.n_kv_heads, s.head_dim
        sq, sk, sv, so = self.scales
        wq = weight(self, "q", (d, n, h), ("embed", "heads", "head_dim"), s, sq)
        wk = weight(self, "k", (d, kv, h), ("embed", "kv_heads", "head_dim"), s, sk)
        wv = weight(self, "v", (d, kv, h), ("embed", "kv_heads", "head_dim"), s, sv)
        wo = weight(self, "o", (n, h, d), ("heads", "head_dim", "embed"), s, so)
        x = x_btd.astype(s.dtype)
        q = jnp.einsum("btd,dnh->btnh", x, wq.astype(s.dtype))
        k = jnp.einsum("btd,dkh->btkh", x, wk.astype(s.dtype))
        v = jnp.einsum("btd,dkh->btkh", x, wv.astype(s.dtype))
        q = with_axes(q, ("activation_batch", "activation_length", "activation_heads", None))
        k = with_axes(k, ("activation_batch", "activation_length", "activation_kv_heads", None))
        qr, kr = rope(q, positions_t, s.rope_theta), rope(k, positions_t, s.rope_theta)
        if depth_kv is None:
            out = jax.nn.dot_product_attention(
                qr,
                kr,
                v,
                is_causal=True,
                implementation=None if s.attention_impl == "xla" else s.attention_impl,
            )
        else:
            out = attention_with_depth(qr, kr, v, q, *depth_kv)
        y = jnp.einsum("btnh,nhd->btd", out, wo.astype(s.dtype))
        return with_axes(y, BTD), (k, v)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

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
        hidden = jax.nn.silu(x @ wg.astype(s.dtype)) * (x @ wu.astype(s.dtype))
        hidden = with_axes(hidden, ("activation_batch", "activation_length", "activation_mlp"))
        return with_axes(hidden @ wd.astype(s.dtype), BTD)
