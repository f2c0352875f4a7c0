"""The depth mix of Attention Residuals, on the XLA path (spec/residuals.md,
families 8 and 9).  Over a bank ``v[B, T, M, d]`` of sources (each token's
``M`` sources side by side), per token::

    r_m     = rsqrt(mean(v_m^2) + eps)           (the key norm's scale)
    logit_m = (v_m . (q w)) r_m                   (no 1/sqrt(d))
    p       = softmax_m(logit) over valid slots   (fp32)
    h       = sum_m p_m v_m                       (values raw)

:func:`depth_mixes` computes ``K`` such mixes of one bank, each with its own
query, key-norm weight and valid slots, in one set of passes over the bank:
attnres computes a block's two mixes together (the MLP side's over the
sources it shares with the attention side, merged later with the newest
source by :func:`merge_source`).  It takes each
slot's ``r`` as an input: the model keeps ``r`` beside the bank, computed
once when the slot is written, so no mix reads the bank for it, and its
gradient (``dl s``) goes back to the slot once, not through every mix.
:func:`depth_mix` is the single mix from a bank ``[M, B, T, d]`` alone (the
fused kernels' layout: their reference, tests).

The forms are chosen for XLA:CPU, where these products are memory-bound and
the bank is read in place, never transposed: the logits and ``d(q w)`` are
2-D dots (one pass over the bank each), the weighted sums a multiply-and-sum
over each token's ``M`` slots, ``dp`` a product batched over tokens.  (The
bank used to be ``[M, B, T, d]``: every weighted sum and ``dp`` then copied
it to ``[B, T, M, d]`` first, and attnres_full's train step at d 64, L 32
took 1.2-1.35x as long: bench/results/depth_memory.md, "the deep-narrow
step".)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def slot_inv_rms(v_mbtd: jax.Array, eps: float) -> jax.Array:
    """``rsqrt(mean(v^2) + eps)`` over the last axis, fp32 (``[..., B, T]``)."""
    v32 = v_mbtd.astype(jnp.float32)
    return jax.lax.rsqrt(jnp.mean(jnp.square(v32), axis=-1) + eps)


def depth_weights(
    bank_mbtd: jax.Array, valid_m: jax.Array, query_d: jax.Array, key_norm_d: jax.Array, eps: float
) -> jax.Array:
    """The softmax weights ``p`` ``[M, B, T]`` (fp32) of a depth mix; invalid slots get 0."""
    v32 = bank_mbtd.astype(jnp.float32)
    qw_d = query_d.astype(jnp.float32) * key_norm_d.astype(jnp.float32)
    logits_mbt = jnp.einsum("mbtd,d->mbt", v32, qw_d) * slot_inv_rms(v32, eps)
    logits_mbt = jnp.where(valid_m[:, None, None], logits_mbt, -jnp.inf)
    return jax.nn.softmax(logits_mbt, axis=0)


@jax.custom_vjp
def depth_mixes(bank_btmd, inv_rms_btm, valid_mk, query_kd, key_norm_kd):
    """``K`` depth mixes of one bank ``[B, T, M, d]``: mix ``k`` over the slots
    where ``valid_mk[:, k]`` (at least one per mix), with ``query_kd[k]`` and
    ``key_norm_kd[k]``, given each slot's ``inv_rms_btm`` (:func:`slot_inv_rms`).
    Returns ``(h_btkd, lse_btk)`` in fp32: the mixes and the log-sum-exp of
    their logits (what an online-softmax merge with one more source needs).

    Differentiated by hand (:func:`_depth_mixes_bwd`): two passes over the
    bank forward (the logits' dot, the weighted sums), three backward (``dp``,
    the bank's cotangent, ``d(q w)``)."""
    return _depth_mixes_fwd(bank_btmd, inv_rms_btm, valid_mk, query_kd, key_norm_kd)[0]


def _depth_mixes_fwd(bank_btmd, inv_rms_btm, valid_mk, query_kd, key_norm_kd):
    v32 = bank_btmd.astype(jnp.float32)
    b, t, m, d = v32.shape
    qw_kd = query_kd.astype(jnp.float32) * key_norm_kd.astype(jnp.float32)
    r_btm1 = inv_rms_btm.astype(jnp.float32)[..., None]
    dot_btmk = jnp.dot(v32.reshape(-1, d), qw_kd.T).reshape(b, t, m, -1)
    logits_btmk = jnp.where(valid_mk, dot_btmk * r_btm1, -jnp.inf)
    top_bt1k = jnp.max(logits_btmk, axis=2, keepdims=True)
    e_btmk = jnp.exp(logits_btmk - top_bt1k)
    z_bt1k = jnp.sum(e_btmk, axis=2, keepdims=True)
    # The barrier keeps XLA from fusing the softmax into the weighted sums
    # (recomputing it for each of the d features).
    p_btmk = jax.lax.optimization_barrier(e_btmk / z_bt1k)
    # A sum over the slots of each token (contiguous), one per mix: faster on
    # CPU than the product batched over tokens, which XLA:CPU runs one token
    # at a time.
    h_btkd = jnp.stack([jnp.sum(p_btmk[..., k, None] * v32, axis=2)
                        for k in range(qw_kd.shape[0])], axis=2)
    lse_btk = (top_bt1k + jnp.log(z_bt1k))[:, :, 0]
    return (h_btkd, lse_btk), (bank_btmd, inv_rms_btm, query_kd, key_norm_kd, dot_btmk, p_btmk)


def _depth_mixes_bwd(res, cts):
    """With ``s = v . (q w)`` and logit ``l = s r``: ``dp_m = dh . v_m``, ``dl =
    p (dp - sum_m p dp + dlse)`` (0 on invalid slots, where ``p`` is),
    ``dv_m = sum_k p_mk dh_k + dl_mk r_m (q w)_k``, ``dr_m = sum_k dl_mk s_mk``
    and ``d(q w)_k = sum_m dl_mk r_m v_m``."""
    bank_btmd, inv_rms_btm, query_kd, key_norm_kd, dot_btmk, p_btmk = res
    dh_btkd, dlse_btk = cts
    v32 = bank_btmd.astype(jnp.float32)
    d = v32.shape[-1]
    qw_kd = query_kd.astype(jnp.float32) * key_norm_kd.astype(jnp.float32)
    # Batched over tokens, reading the bank in place (as sums over d, one per
    # mix, it was slower: each reads the bank again).
    dp_btmk = jnp.einsum("btmd,btkd->btmk", v32, dh_btkd)
    dl_btmk = p_btmk * (dp_btmk - jnp.sum(p_btmk * dp_btmk, axis=2, keepdims=True)
                        + dlse_btk[:, :, None])
    a_btmk = dl_btmk * inv_rms_btm.astype(jnp.float32)[..., None]
    p_btmk, a_btmk = jax.lax.optimization_barrier((p_btmk, a_btmk))  # as in forward
    dv_btmd = sum(p_btmk[..., k, None] * dh_btkd[:, :, None, k]
                  + a_btmk[..., k, None] * qw_kd[k] for k in range(qw_kd.shape[0]))
    dqw_kd = jnp.dot(a_btmk.reshape(-1, qw_kd.shape[0]).T, v32.reshape(-1, d))
    return (dv_btmd.astype(bank_btmd.dtype),
            jnp.sum(dl_btmk * dot_btmk, axis=-1).astype(inv_rms_btm.dtype), None,
            (dqw_kd * key_norm_kd.astype(jnp.float32)).astype(query_kd.dtype),
            (dqw_kd * query_kd.astype(jnp.float32)).astype(key_norm_kd.dtype))


depth_mixes.defvjp(_depth_mixes_fwd, _depth_mixes_bwd)


def depth_mix(
    bank_mbtd: jax.Array, valid_m: jax.Array, query_d: jax.Array, key_norm_d: jax.Array, eps: float
) -> jax.Array:
    """One softmax-over-depth mix of the valid sources of a bank ``[M, B, T, d]``
    (the kernels' layout), in fp32; ``[B, T, d]`` in the bank's dtype.  Invalid
    slots get zero weight; slot 0 must be valid."""
    bank_btmd = jnp.moveaxis(bank_mbtd, 0, 2)
    h_btkd, _ = depth_mixes(bank_btmd, slot_inv_rms(bank_btmd, eps), valid_m[:, None],
                            query_d[None], key_norm_d[None])
    return h_btkd[:, :, 0].astype(bank_mbtd.dtype)


def merge_source(h_btd, lse_bt, source_btd, inv_rms_bt, query_d, key_norm_d):
    """A mix (``h``, fp32, with its logits' log-sum-exp) with one more source
    folded in, given the source's inverse RMS: the mix over the union, in the
    source's dtype (an online softmax; ``pallas_kernels.merge_partial`` is the
    same merge, recomputing the RMS)."""
    v32 = source_btd.astype(jnp.float32)
    qw_d = query_d.astype(jnp.float32) * key_norm_d.astype(jnp.float32)
    logit_bt = jnp.einsum("btd,d->bt", v32, qw_d) * inv_rms_bt
    top_bt = jnp.maximum(lse_bt, logit_bt)
    old, new = jnp.exp(lse_bt - top_bt)[..., None], jnp.exp(logit_bt - top_bt)[..., None]
    return ((old * h_btd + new * v32) / (old + new)).astype(source_btd.dtype)
