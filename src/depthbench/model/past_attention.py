"""Attention over keys cached from earlier positions, in parts merged by their
log-sum-exps.

A decode step's queries see two kinds of keys: their own tokens' (causal
among themselves, :func:`depthbench.model.layers.causal_part`) and the
cache's, every position a row has already processed (:func:`past_part`).
Each part is a softmax normalised on its own, returned with each row's
log-sum-exp, and :func:`merge_parts` joins them into the one softmax over
all keys; moda's depth keys are more parts of the same kind
(``residual/parts/moda_attention.py``).  fp32 throughout.

The cache layout is ``[B, K, S, H]`` (kv heads before positions): the
products are plain batched matmuls over ``(B, K)`` with the ``G = N / K``
query heads of a key head stacked along the rows, so XLA reads the cache in
place rather than copying it into a transposed layout every step.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    """A decoder's cache: each layer's rotated keys and values of the positions
    every row has processed, in the compute dtype, kv heads only (GQA), and
    what the family carries across positions (``capabilities.PositionState``;
    None for a family whose state is per token).  Row ``b`` holds positions
    ``0 .. lengths_b[b] - 1``; the rest of its ``S`` slots is padding."""

    k_lbksh: jax.Array  # [L, B, K, S, H]
    v_lbksh: jax.Array  # [L, B, K, S, H]
    lengths_b: jax.Array  # [B] int32
    carry: Any = None

    def valid_bs(self) -> jax.Array:
        """``[B, S]``: the slots each row holds."""
        return jnp.arange(self.k_lbksh.shape[3])[None, :] < self.lengths_b[:, None]


# The cache's logical axes (``depthbench.parallel``'s table): sharded like the
# activations of the train step, batch over (data, fsdp), kv heads over tensor.
CACHE_AXES = ("layers", "activation_batch", "activation_kv_heads", "activation_length", None)


class PastKeys(NamedTuple):
    """The keys and values of earlier positions an attention sublayer also sees."""

    k_bksh: jax.Array  # rotated keys [B, K, S, H]
    v_bksh: jax.Array  # values [B, K, S, H]
    valid_bs: jax.Array  # [B, S] bool: positions the row holds (the rest is padding)


def past_part(q_btnh: jax.Array, past: PastKeys) -> tuple[jax.Array, jax.Array]:
    """Softmax attention of the (scaled, fp32) queries over the valid cached keys:
    the output ``[B, T, N, H]`` and each row's log-sum-exp ``[B, T, N]`` (``-inf``
    and output 0 where a row holds no position yet)."""
    b, t, n, h = q_btnh.shape
    kv = past.k_bksh.shape[1]
    # Query head i uses key head i // G (GQA); its G heads x T tokens are rows.
    q_bkmh = q_btnh.reshape(b, t, kv, n // kv, h).transpose(0, 2, 3, 1, 4).reshape(b, kv, -1, h)
    logits_bkms = jnp.einsum("bkmh,bksh->bkms", q_bkmh, past.k_bksh.astype(jnp.float32))
    logits_bkms = jnp.where(past.valid_bs[:, None, None, :], logits_bkms, -jnp.inf)
    mu_bkm1 = jnp.max(logits_bkms, axis=-1, keepdims=True)
    mu_bkm1 = jnp.where(mu_bkm1 > -jnp.inf, mu_bkm1, 0.0)  # no valid key: every e^ is 0
    e_bkms = jnp.exp(logits_bkms - mu_bkm1)
    sum_bkm1 = jnp.sum(e_bkms, axis=-1, keepdims=True)
    out_bkmh = jnp.einsum("bkms,bksh->bkmh", e_bkms / jnp.where(sum_bkm1 > 0, sum_bkm1, 1.0),
                          past.v_bksh.astype(jnp.float32))
    lse_bkm = (mu_bkm1 + jnp.log(sum_bkm1))[..., 0]
    out_btnh = out_bkmh.reshape(b, kv, n // kv, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)
    lse_btn = lse_bkm.reshape(b, kv, n // kv, t).transpose(0, 3, 1, 2).reshape(b, t, n)
    return out_btnh, lse_btn


def merge_parts(parts) -> jax.Array:
    """One softmax from parts each normalised on its own: ``parts`` is a sequence
    of ``(out_btnh, lse_btn)``; the first must have a finite log-sum-exp (the
    causal part: each query sees its own token), a part with ``-inf`` weighs 0::

        lse = log(sum_parts e^lse_part)
        out = sum_parts e^(lse_part - lse) out_part
    """
    mu_btn = jax.lax.stop_gradient(functools.reduce(jnp.maximum, [lse for _, lse in parts]))
    weights = [jnp.exp(lse - mu_btn) for _, lse in parts]
    total_btn = functools.reduce(jnp.add, weights)
    return functools.reduce(jnp.add, [o * (w / total_btn)[..., None]
                                      for (o, _), w in zip(parts, weights, strict=True)])
