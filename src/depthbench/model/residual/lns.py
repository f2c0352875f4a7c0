"""lns (LayerNorm Scaling): ``x <- x + F(N(x) / l^p)``, ``l = b + 1``, ``p = 0.5``.

The normalised input of both sublayers of block ``b`` is divided by a
constant ``l^p`` (not learned) that damps the growth of the residual-stream
variance with depth (the "curse of depth").  ``l`` is the block's
*identity* (its original index + 1), so the factor travels with a block
when the analyses permute blocks: it belongs to the weights trained under it.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from depthbench.errors import ConfigError
from depthbench.model.residual.protocol.base import ResidualFamily
from depthbench.model.residual.protocol.capabilities import ScaledInput
from depthbench.model.residual.protocol.family_config import FamilyConfig, check_number
from depthbench.model.residual.protocol.original_format import OriginalFormat, Reading


def lns_scale(ident, power: float):
    """``(ident + 1) ** -power`` in fp32 (``ident`` may be traced)."""
    l = jnp.asarray(ident).astype(jnp.float32) + 1.0  # noqa: E741 (the paper's l)
    return l ** jnp.float32(-power)


@dataclasses.dataclass(frozen=True)
class LNSConfig(FamilyConfig):
    lns_power: float = 0.5  # divide by l ** lns_power (l = 1-based block identity)

    def validate(self, config) -> None:
        check_number("lns_power", self.lns_power, 0.0, meaning="0.5 divides by sqrt(l)")


@dataclasses.dataclass(frozen=True)
class LNS(ResidualFamily, ScaledInput, OriginalFormat):
    name = "lns"
    description = "LayerNorm Scaling: x <- x + F(N(x) / sqrt(l)), l = 1-based block identity"
    reference = "Sun et al. 2025, The Curse of Depth in Large Language Models (arXiv 2502.05795)"
    Config = LNSConfig
    # LayerNormScaledTransformerBlock (block.py@6bdf2ad): 1/sqrt(i+1), a buffer
    # ln_scale in earlier checkpoints (@fd0cc94), recomputed here.
    original_blocks = ("default_scaled",)
    original_ignored = (".ln_scale",)

    @classmethod
    def from_original(cls, block, saved, options):
        return Reading(block="default_scaled", residual={"lns_power": 0.5})

    def to_original(self):
        if self.power != 0.5:
            raise ConfigError(f"the original's LNS divides by sqrt(l); this lns has lns_power "
                              f"{self.power:g}")
        return {"name": "default_scaled"}

    def original_buffers(self, i):
        """``ln_scale``: upstream OLMo-core's ``default_scaled`` block keeps it (its
        loader wants the key), fp32 of ``1 / math.sqrt(i + 1)`` as it computes it."""
        return {"ln_scale": np.float32(1.0 / math.sqrt(i + 1))}

    @property
    def power(self) -> float:
        return float(self.cfg.lns_power)

    def input_scale(self, p, x_in, site):
        return x_in * lns_scale(site.ident, self.power).astype(x_in.dtype)

    def describe(self) -> dict:
        return {**super().describe(), "lns_power": self.power}
