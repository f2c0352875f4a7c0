"""keel: Post-LN with a highway-weighted residual, ``alpha = 2L``.

Block 0::

    h   = x + Attn(N_a(x))
    out = N_pf(h + MLP(N_f(h)))

Blocks ``b > 0``::

    h   = N_pa(alpha * x + Attn(N_a(x)))
    out = N_pf(alpha * h + MLP(N_f(h)))

``N_a``/``N_f`` are the backbone's pre-norms (so ``pre_norm`` stays on) and
``N_pa``/``N_pf`` two extra RMSNorms per block.  Every block owns an
``N_pa`` so the scanned parameters have one shape; the block that runs at
position 0 does not use its own.  "Block 0" is the execution position, not
the identity: it is where the stream still holds the raw embedding.
``keel_alpha`` overrides ``2L`` when non-zero.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from depthbench.errors import ConfigError
from depthbench.model.residual.protocol.base import (
    ResidualFamily,
    gate,
    norm_param,
    post_norm,
    rms_norm,
)
from depthbench.model.residual.protocol.capabilities import CostTerms
from depthbench.model.residual.protocol.family_config import FamilyConfig, check_number
from depthbench.model.residual.protocol.original_format import PRE_NORMS, Constant, OriginalFormat

_POST = ("attn_post_norm", "mlp_post_norm")  # N_pa, N_pf


@dataclasses.dataclass(frozen=True)
class KeelConfig(FamilyConfig):
    keel_alpha: float = 0.0  # 0: 2L

    def validate(self, config) -> None:
        check_number("keel_alpha", self.keel_alpha, 0.0, meaning="0 = 2L")


@dataclasses.dataclass(frozen=True)
class Keel(ResidualFamily, CostTerms, OriginalFormat):
    name = "keel"
    description = ("KEEL: h = N_pa(alpha x + Attn(N_a(x))), out = N_pf(alpha h + MLP(N_f(h))), "
                   "alpha = 2L; block 0 unscaled, no N_pa")
    reference = ("Chen & Wei 2026, Post-LayerNorm Is Back: Stable, ExpressivE, and Deep "
                 "(arXiv 2601.19895)")
    Config = KeelConfig
    original_blocks = ("keel",)  # KeelTransformerBlock (block.py@6bdf2ad)

    def original_norms(self, i):
        post = {"post_feed_forward_norm": "blocks/residual/mlp_post_norm"}
        if i:  # the original's block 0 has no N_pa
            post["post_attention_norm"] = "blocks/residual/attn_post_norm"
        return {**PRE_NORMS, **post}

    def original_block_tensors(self, i):
        # depthbench keeps an N_pa on block 0 too, unused there: set to 1
        return [] if i else [Constant("blocks/residual/attn_post_norm", (0,), 1.0)]

    def to_original(self):
        if self.cfg.keel_alpha:
            raise ConfigError("the original's KEEL takes alpha = 2L; this keel sets keel_alpha")
        return {"name": "keel"}

    @property
    def alpha(self) -> float:
        return float(self.cfg.keel_alpha) or 2.0 * self.spec.depth

    def create_block_params(self, mod, ident):
        return {k: norm_param(mod, k, self.spec.d_model, self.spec.pdtype) for k in _POST}

    def write(self, p, state, y, site, aux, active):
        first = site.pos == 0
        carry = jnp.where(first, 1.0, self.alpha)
        new = post_norm(rms_norm, state, y, p[_POST[site.sub]], self.spec.norm_eps, carry)
        if site.sub == 0:  # block 0's attention sublayer has no post-norm
            new = jnp.where(first, state + y, new)
        return gate(active, new, state)

    def extra_block_params(self) -> int:
        return 2 * self.spec.d_model  # N_pa and N_pf

    def describe(self) -> dict:
        return {**super().describe(), "alpha": self.alpha}
