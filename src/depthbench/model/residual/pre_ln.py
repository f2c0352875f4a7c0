"""pre_ln: ``x <- x + F(N(x))``; readout ``x``.  The protocol's defaults."""

from __future__ import annotations

import dataclasses

from depthbench.model.residual.protocol.base import ResidualFamily
from depthbench.model.residual.protocol.original_format import OriginalFormat


@dataclasses.dataclass(frozen=True)
class PreLN(ResidualFamily, OriginalFormat):
    name = "pre_ln"
    description = "Pre-LN residual: x <- x + F(N(x)) (the LLaMA default)"
    reference = "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture"
    original_blocks = ("default",)  # the original's TransformerBlock, unchanged
    baseline = True  # the LLaMA backbone itself
