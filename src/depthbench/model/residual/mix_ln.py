"""mix_ln: post_ln in the first ``round(0.25 L)`` blocks, pre_ln after.

One RMSNorm per sublayer serves either placement: after the residual
addition in a post-LN block (``x <- N(x + F(x))``), before the sublayer in
a pre-LN block (``x <- x + F(N(x))``).  Every block has the same parameters
(the scan stays uniform); the placement is chosen per block from its
execution position with ``jnp.where``, so a permuted block takes the
placement of the slot it runs in.  The backbone's own pre-norm is off
(``pre_norm = False``): this module applies the norm itself.

``round`` is half-up (``floor(f L + 0.5)``), so ``L = 2`` has one post-LN
block and ``L = 10`` three; ``mix_ln_fraction`` sets ``f`` (0 = pre_ln,
1 = post_ln).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from depthbench.model.residual.protocol.base import ResidualFamily, gate, norm_param, rms_norm
from depthbench.model.residual.protocol.family_config import FamilyConfig, check_number

_NORM = ("attn_norm", "mlp_norm")


def post_ln_blocks(depth: int, fraction: float) -> int:
    """How many leading blocks are post-LN: ``round(fraction * depth)``, half up."""
    return int(math.floor(fraction * depth + 0.5))


@dataclasses.dataclass(frozen=True)
class MixLNConfig(FamilyConfig):
    mix_ln_fraction: float = 0.25  # the first round(fraction * L) blocks are post_ln

    def validate(self, config) -> None:
        check_number("mix_ln_fraction", self.mix_ln_fraction, 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class MixLN(ResidualFamily):
    name = "mix_ln"
    description = "Mix-LN: post-LN in the first round(0.25 L) blocks, pre-LN in the rest"
    reference = ("Li et al. 2025, Mix-LN: Unleashing the Power of Deeper Layers by Combining "
                 "Pre-LN and Post-LN (arXiv 2412.13795)")
    pre_norm = False
    Config = MixLNConfig

    @property
    def n_post(self) -> int:
        return post_ln_blocks(self.spec.depth, float(self.cfg.mix_ln_fraction))

    def create_block_params(self, mod, ident):
        return {k: norm_param(mod, k, self.spec.d_model, self.spec.pdtype) for k in _NORM}

    def read(self, p, state, site):
        post = site.pos < self.n_post
        return jnp.where(post, state, rms_norm(state, p[_NORM[site.sub]], self.spec.norm_eps)), {}

    def write(self, p, state, y, site, aux, active):
        post = site.pos < self.n_post
        # Not base.post_norm: the one fp32 sum feeds both placements (a second
        # sum for the norm changes XLA's fusion and the last bits of the loss).
        total = state.astype(jnp.float32) + y.astype(jnp.float32)
        normed = rms_norm(total, p[_NORM[site.sub]], self.spec.norm_eps)
        return gate(active, jnp.where(post, normed, total).astype(state.dtype), state)

    # One norm per sublayer, like pre_ln: no parameters beyond pre_ln's.

    def describe(self) -> dict:
        return {**super().describe(), "post_ln_blocks": self.n_post}
