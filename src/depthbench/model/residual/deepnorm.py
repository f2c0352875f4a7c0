"""deepnorm: ``x <- LN(alpha * x + F(x))`` with a down-scaled init.

Post-norm with an up-weighted residual: ``alpha = (2L)^(1/4)``; no pre-norm;
``LN`` is mean-centred LayerNorm without bias (learned weight, init 1), one
per sublayer, replacing pre_ln's two pre-norms (same parameter count).  The
value projection, the attention output projection and all MLP matrices
start with their std times ``beta = (8L)^(-1/4)`` (query and key do not):
the decoder-only constants of DeepNet.  ``deepnorm_alpha`` /
``deepnorm_beta`` override the formulas when non-zero.
"""

from __future__ import annotations

import dataclasses

from depthbench.errors import ConfigError
from depthbench.model.residual.protocol.base import (
    ResidualFamily,
    gate,
    layer_norm,
    norm_param,
    post_norm,
)
from depthbench.model.residual.protocol.family_config import FamilyConfig, check_number
from depthbench.model.residual.protocol.original_format import OriginalFormat

_LN = ("attn_post_ln", "mlp_post_ln")
_BETA_MATRICES = frozenset({"v", "o", "gate", "up", "down"})


def deepnorm_alpha(depth: int) -> float:
    return (2.0 * depth) ** 0.25


def deepnorm_beta(depth: int) -> float:
    return (8.0 * depth) ** -0.25


@dataclasses.dataclass(frozen=True)
class DeepNormConfig(FamilyConfig):
    deepnorm_alpha: float = 0.0  # 0: (2L)^(1/4)
    deepnorm_beta: float = 0.0  # 0: (8L)^(-1/4)

    def validate(self, config) -> None:
        check_number("deepnorm_alpha", self.deepnorm_alpha, 0.0, meaning="0 = the DeepNet formula")
        check_number("deepnorm_beta", self.deepnorm_beta, 0.0, meaning="0 = the DeepNet formula")


@dataclasses.dataclass(frozen=True)
class DeepNorm(ResidualFamily, OriginalFormat):
    name = "deepnorm"
    description = "DeepNorm: x <- LN(alpha x + F(x)), alpha=(2L)^1/4, init x beta=(8L)^-1/4"
    reference = "Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers (arXiv 2203.00555)"
    pre_norm = False
    Config = DeepNormConfig
    # DeepNormTransformerBlock (block.py@6bdf2ad): its attention_norm and
    # feed_forward_norm are the post-LNs, mean-centred (layer_norm.name "default").
    original_blocks = ("deepnorm",)
    original_norm = "default"

    def original_norms(self, i):
        return {"attention_norm": "blocks/residual/attn_post_ln",
                "feed_forward_norm": "blocks/residual/mlp_post_ln"}

    def to_original(self):
        if self.cfg.deepnorm_alpha or self.cfg.deepnorm_beta:
            raise ConfigError("the original's DeepNorm takes alpha and beta from the depth; "
                              "this deepnorm sets deepnorm_alpha or deepnorm_beta")
        return {"name": "deepnorm"}

    @property
    def alpha(self) -> float:
        return float(self.cfg.deepnorm_alpha) or deepnorm_alpha(self.spec.depth)

    @property
    def beta(self) -> float:
        return float(self.cfg.deepnorm_beta) or deepnorm_beta(self.spec.depth)

    def create_block_params(self, mod, ident):
        return {k: norm_param(mod, k, self.spec.d_model, self.spec.pdtype) for k in _LN}

    def init_scale(self, matrix: str) -> float:
        return self.beta if matrix in _BETA_MATRICES else 1.0

    def write(self, p, state, y, site, aux, active):
        new = post_norm(layer_norm, state, y, p[_LN[site.sub]], self.spec.norm_eps, self.alpha)
        return gate(active, new, state)

    # Two post-LNs replace the two pre-norms: no parameters beyond pre_ln's.

    def describe(self) -> dict:
        return {**super().describe(), "alpha": self.alpha, "beta": self.beta}
