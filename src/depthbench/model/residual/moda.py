"""moda: mixture-of-depths attention on a pre-LN residual stream.

Each attention head's one softmax covers the causal sequence keys of the
current block **and** depth keys at the same token written by earlier
sublayers (spec/residuals.md, family 10):

* the attention sublayer of block ``b`` (execution position) writes its own
  pre-RoPE ``k, v`` (``aux["kv"]``) into depth slot ``2b``;
* the MLP sublayer writes ``k, v`` from an extra linear ``d -> 2 n_kv d_h``
  (parameter ``depth_kv``, init like the backbone's K/V) on its normalised
  input (``aux["x_in"]``) into slot ``2b + 1``;
* the attention of block ``b`` sees slots ``0 .. 2b - 1``: block 0 is
  ordinary causal attention.  RoPE cancels at equal positions, so depth
  logits use the unrotated query (``layers.attention_with_depth``).

Only slots a later attention reads are kept: ``M = 2L - 2`` of them, so the
last block writes nothing (its MLP does not even compute its extra linear:
``lax.cond``); every block owns the extra linear so the scanned parameters
have one shape, and the last block's copy is unused (it is still counted
in ``extra_block_params``: it exists and is trained by nothing).

State: ``{"x": [B, T, d], "k", "v": [B, T, M, n_kv, d_h], "valid": [M]}``.
Slots follow execution positions (``Site.j``); a skipped block (``active``
false) leaves ``x`` unchanged and its two slots invalid: it writes no depth
keys.  Each write touches one slot.  The cache is in the compute dtype.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from depthbench.model.layers import weight
from depthbench.model.residual.base import BTD, ResidualFamily, gate, with_axes

BTMKH = ("activation_batch", "activation_length", "activation_sources", "activation_kv_heads", None)


def put_slot(cache_btmkh: jax.Array, new_btkh: jax.Array, j: jax.Array, ok: jax.Array) -> jax.Array:
    """``cache[:, :, j] = new`` where ``ok`` (else unchanged); one slot read and written.

    ``j`` past the end is clamped by ``dynamic_update_slice``, so the old value
    of the clamped slot is written back unless ``ok`` (which excludes it)."""
    m = cache_btmkh.shape[2]
    jj = jnp.minimum(j, m - 1)
    old = jax.lax.dynamic_index_in_dim(cache_btmkh, jj, axis=2, keepdims=False)
    new = jnp.where(ok, new_btkh.astype(cache_btmkh.dtype), old)
    return jax.lax.dynamic_update_index_in_dim(cache_btmkh, new, jj, axis=2)


@dataclasses.dataclass(frozen=True)
class MoDA(ResidualFamily):
    name = "moda"
    description = (
        "mixture-of-depths attention: one softmax over the causal sequence keys and "
        "the same token's keys from earlier sublayers"
    )
    reference = "Mixture-of-Depths Attention, 2026 (arXiv 2603.15619)"
    sharding_rules = (("activation_sources", None),)  # the depth-KV cache's slot axis

    @property
    def n_slots(self) -> int:
        """``M = 2L - 2``: sublayers whose keys a later attention sublayer reads."""
        return max(2 * self.spec.depth - 2, 0)

    # ------------------------------------------------------------ parameters
    def create_block_params(self, mod, ident):
        s = self.spec
        w = weight(
            mod,
            "depth_kv",
            (s.d_model, 2, s.n_kv_heads, s.head_dim),
            ("embed", None, "kv_heads", "head_dim"),
            s,
        )
        return {"depth_kv": w}

    # ------------------------------------------------------------ protocol
    def init_state(self, g, x0):
        s, m = self.spec, self.n_slots
        b, t, _ = x0.shape
        cache = with_axes(jnp.zeros((b, t, m, s.n_kv_heads, s.head_dim), x0.dtype), BTMKH)
        return {"x": x0, "k": cache, "v": cache, "valid": jnp.zeros((m,), bool)}

    def read(self, p, state, site):
        if site.sub == 0 and self.n_slots > 0:
            return state["x"], {"depth_kv": (state["k"], state["v"], state["valid"])}
        return state["x"], {}

    def _depth_kv(self, p, x_in_btd):
        s = self.spec
        kv = jnp.einsum("btd,dckh->cbtkh", x_in_btd.astype(s.dtype), p["depth_kv"].astype(s.dtype))
        return kv[0], kv[1]

    def write(self, p, state, y, site, aux, active):
        x = with_axes(gate(active, state["x"] + y, state["x"]), BTD)
        m = self.n_slots
        if m == 0:
            return {**state, "x": x}
        j = site.j
        ok = active & (j < m)
        if site.sub == 0:
            k, v = aux["kv"]
        else:
            # The last block's MLP keys are never read: do not compute them.
            zeros = jnp.zeros(
                (*y.shape[:2], self.spec.n_kv_heads, self.spec.head_dim), self.spec.dtype
            )
            k, v = jax.lax.cond(
                ok, lambda xi: self._depth_kv(p, xi), lambda xi: (zeros, zeros), aux["x_in"]
            )
        valid = state["valid"] | ((jnp.arange(m) == j) & ok)
        return {
            "x": x,
            "k": with_axes(put_slot(state["k"], k, j, ok), BTMKH),
            "v": with_axes(put_slot(state["v"], v, j, ok), BTMKH),
            "valid": valid,
        }

    def readout(self, g, state, final_norm):
        return final_norm(state["x"])

    def depth_state(self, g, state):
        return state["x"]

    def lens_input(self, g, state):
        return state["x"]

    # ------------------------------------------------------------ costs
    def extra_block_params(self) -> int:
        """The MLP sublayer's key/value projection ``d x 2 n_kv d_h``."""
        s = self.spec
        return 2 * s.d_model * s.n_kv_heads * s.head_dim

    def extra_flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token beyond pre_ln's, multiply-add = 2:

        * depth attention: the attention of the block at position ``b`` scores
          and averages ``2b`` depth keys per query head, ``2 d_h`` FLOPs each for
          ``q . k`` and for ``p v``: ``4 d`` per key over the ``n_heads`` heads;
          summed over ``b``: ``4 d L (L - 1)`` (no causal halving: every depth
          key is visible);
        * the extra projection in the ``L - 1`` MLPs that write:
          ``2 d (2 n_kv d_h)`` each."""
        s = self.spec
        attn = 4 * s.d_model * s.depth * (s.depth - 1)
        proj = (s.depth - 1) * 2 * s.d_model * 2 * s.n_kv_heads * s.head_dim
        return float(attn + proj)

    def state_floats_per_token(self) -> int:
        """The stream ``d`` plus the depth cache ``2 M n_kv d_h``, ``M = 2L - 2``."""
        s = self.spec
        return s.d_model + 2 * self.n_slots * s.n_kv_heads * s.head_dim

    def describe(self) -> dict:
        return {**super().describe(), "depth_slots": self.n_slots}
