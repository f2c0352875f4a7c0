"""Prefill and decode steps with a KV cache, for every residual family.

Both are pure (jit once per shape); padding never leaks (the prefill is causal,
cache slots past a row's length are masked until written).  The cache holds
every layer's K/V, plus the carry of a family declaring
``capabilities.PositionState`` (no built-in one: their states are per token)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from depthbench.model.past_attention import CACHE_AXES, KVCache
from depthbench.model.residual.protocol.capabilities import PositionState

# ``model`` below is a :class:`depthbench.model.transformer.Transformer`; it calls
# resume and carry in its forward, so this module does not import it.


def resume(fam, g, state, cache: KVCache | None, positions, xs: dict):
    """``(state, positions, valid_bs)`` of a forward that continues each row where
    ``cache`` stands (unchanged, ``valid_bs`` None, without a cache): the
    family resumes its carry, the tokens sit at ``lengths_b + positions``, and
    each layer's cached keys ride in the scan's inputs (``xs["past"]``)."""
    if cache is None:
        return state, positions, None
    if isinstance(fam, PositionState):
        state = fam.resume(g, state, cache.carry)
    xs["past"] = tuple(nn.with_logical_constraint(c, CACHE_AXES)
                       for c in (cache.k_lbksh, cache.v_lbksh))
    return state, cache.lengths_b[:, None] + positions, cache.valid_bs()


def carry(fam, g, state, shape_bt: tuple[int, int], logits_at):
    """What ``fam`` carries to later positions, taken at each row's last token
    (``logits_at`` [B], or the last position)."""
    if not isinstance(fam, PositionState):
        raise ValueError(f"capture: {fam.spec.family} carries nothing across positions "
                         "(no capabilities.PositionState)")
    last_b = jnp.full(shape_bt[:1], shape_bt[1] - 1, jnp.int32)
    return fam.carry(g, state, last_b if logits_at is None else logits_at)


def _captures(model: nn.Module) -> tuple[str, ...]:
    carries = isinstance(model.family, PositionState)
    return ("kv", "carry") if carries else ("kv",)


def _as_cache_layout(x_lbtkh: jax.Array) -> jax.Array:
    """``[L, B, T, K, H]`` -> ``[L, B, K, T, H]`` (the cache's layout) with its axes."""
    return nn.with_logical_constraint(x_lbtkh.transpose(0, 1, 3, 2, 4), CACHE_AXES)


def prefill(model: nn.Module, params, tokens_bp: jax.Array, lengths_b: jax.Array,
            size: int) -> tuple[jax.Array, KVCache]:
    """``(logits [B, V] at each row's last prompt token, cache of size slots)``.

    ``tokens_bp`` holds row ``b``'s prompt in its first ``lengths_b[b]`` places
    (``1 <= lengths_b <= P <= size``)."""
    p = tokens_bp.shape[1]
    if p > size:
        raise ValueError(f"prefill: {p} prompt positions do not fit a cache of {size}")
    lengths_b = lengths_b.astype(jnp.int32)
    logits_bv, cap = model.apply({"params": params}, tokens_bp, capture=_captures(model),
                                 logits_at=lengths_b - 1)
    pad = ((0, 0), (0, 0), (0, 0), (0, size - p), (0, 0))
    k, v = (jnp.pad(_as_cache_layout(cap["kv"][n]), pad) for n in ("k", "v"))
    return logits_bv, KVCache(_constrain(k), _constrain(v), lengths_b, cap.get("carry"))


def decode_step(model: nn.Module, params, cache: KVCache, tokens_bt: jax.Array
                ) -> tuple[jax.Array, KVCache]:
    """``(logits [B, V] after each row's last new token, cache)``: ``tokens_bt``
    ``[B, T]`` (``T`` usually 1) continue each row at ``cache.lengths_b``; the
    rows must have ``T`` free slots."""
    t = tokens_bt.shape[1]
    logits_bv, cap = model.apply({"params": params}, tokens_bt, capture=_captures(model),
                                 cache=cache, logits_at=jnp.full(tokens_bt.shape[:1], t - 1))
    k = _write(cache.k_lbksh, _as_cache_layout(cap["kv"]["k"]), cache.lengths_b)
    v = _write(cache.v_lbksh, _as_cache_layout(cap["kv"]["v"]), cache.lengths_b)
    return logits_bv, KVCache(k, v, cache.lengths_b + t, cap.get("carry"))


def _write(cache_lbksh: jax.Array, new_lbkth: jax.Array, at_b: jax.Array) -> jax.Array:
    """The cache with row ``b``'s new slots written from ``at_b[b]`` on: one
    scatter of the new slots (in place where the cache's buffer is donated),
    never a pass over the whole cache."""
    def row(c_lksh, n_lkth, at):
        return jax.lax.dynamic_update_slice_in_dim(c_lksh, n_lkth.astype(c_lksh.dtype), at, 2)

    return _constrain(jax.vmap(row, in_axes=(1, 1, 0), out_axes=1)(cache_lbksh, new_lbkth, at_b))


def _constrain(x_lbksh: jax.Array) -> jax.Array:
    return nn.with_logical_constraint(x_lbksh, CACHE_AXES)
