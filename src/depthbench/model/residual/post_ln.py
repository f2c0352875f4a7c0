"""post_ln: ``x <- N(x + F(x))`` (the original Transformer's placement).

No pre-norm: each sublayer reads the residual stream directly and an
RMSNorm (learned weight, init 1) follows the residual addition.  The two
post-norms replace pre_ln's two pre-norms, so the parameter count is pre_ln's.
"""

from __future__ import annotations

import dataclasses

from depthbench.model.residual.protocol.base import (
    ResidualFamily,
    gate,
    norm_param,
    post_norm,
    rms_norm,
)
from depthbench.model.residual.protocol.original_format import POST_NORMS, OriginalFormat

_NORM = ("attn_post_norm", "mlp_post_norm")


@dataclasses.dataclass(frozen=True)
class PostLN(ResidualFamily, OriginalFormat):
    name = "post_ln"
    description = "Post-LN residual: x <- N(x + F(x))"
    reference = "Vaswani et al. 2017, Attention Is All You Need"
    pre_norm = False
    # The MoDA baseline (examples/pretrain_postnorm.py@d15e34b): its attention_norm
    # and feed_forward_norm follow the residual additions.
    original_blocks = ("post_norm",)

    def original_norms(self, i):
        return POST_NORMS

    def create_block_params(self, mod, ident):
        return {k: norm_param(mod, k, self.spec.d_model, self.spec.pdtype) for k in _NORM}

    def write(self, p, state, y, site, aux, active):
        new = post_norm(rms_norm, state, y, p[_NORM[site.sub]], self.spec.norm_eps)
        return gate(active, new, state)
