"""sandwich_ln (Peri-LN): ``x <- x + N'(F(N(x)))``.

Each sublayer keeps the backbone's pre-norm ``N`` and gains a second RMSNorm
``N'`` (learned weight, init 1) on its output, so a block has four norms.
Normalising the branch output bounds what each sublayer can add to the
residual stream, whatever the scale its weights drift to.
"""

from __future__ import annotations

import dataclasses

from depthbench.model.residual.protocol.base import ResidualFamily, gate, norm_param, rms_norm
from depthbench.model.residual.protocol.capabilities import CostTerms
from depthbench.model.residual.protocol.original_format import PRE_NORMS, OriginalFormat

_POST = ("attn_post_norm", "mlp_post_norm")  # N' of the attention and MLP sublayers


@dataclasses.dataclass(frozen=True)
class SandwichLN(ResidualFamily, CostTerms, OriginalFormat):
    name = "sandwich_ln"
    description = "Peri-LN / sandwich: x <- x + N'(F(N(x))), a second RMSNorm on every output"
    reference = ("Kim et al. 2025, Peri-LN: Revisiting Layer Normalization in the Transformer "
                 "Architecture; Ding et al. 2021, CogView (sandwich-LN)")
    original_blocks = ("peri_norm",)  # PeriNormTransformerBlock (block.py@6bdf2ad)

    def original_norms(self, i):
        return {**PRE_NORMS, "post_attention_norm": "blocks/residual/attn_post_norm",
                "post_feed_forward_norm": "blocks/residual/mlp_post_norm"}

    def create_block_params(self, mod, ident):
        return {k: norm_param(mod, k, self.spec.d_model, self.spec.pdtype) for k in _POST}

    def write(self, p, state, y, site, aux, active):
        out = rms_norm(y, p[_POST[site.sub]], self.spec.norm_eps)
        return gate(active, state + out, state)

    def extra_block_params(self) -> int:
        return 2 * self.spec.d_model  # N' of both sublayers
