"""The registry of residual families: one line per family.

The shared tests, the trainer, the cost model and the analyses iterate over
this table; adding a family is one new file in this package plus one line here.
"""

from __future__ import annotations

from depthbench.config import ConfigError
from depthbench.model.residual.attnres import AttnResBlock, AttnResFull
from depthbench.model.residual.base import ResidualFamily
from depthbench.model.residual.completep import CompleteP
from depthbench.model.residual.deepnorm import DeepNorm
from depthbench.model.residual.hc import HC
from depthbench.model.residual.keel import Keel
from depthbench.model.residual.lns import LNS
from depthbench.model.residual.mhc import MHC
from depthbench.model.residual.mix_ln import MixLN
from depthbench.model.residual.moda import MoDA
from depthbench.model.residual.post_ln import PostLN
from depthbench.model.residual.pre_ln import PreLN
from depthbench.model.residual.sandwich_ln import SandwichLN

FAMILIES: dict[str, type[ResidualFamily]] = {
    cls.name: cls
    for cls in (
        PreLN,
        SandwichLN,
        LNS,
        DeepNorm,
        Keel,
        HC,
        MHC,
        AttnResFull,
        AttnResBlock,
        MoDA,
        PostLN,
        MixLN,
        CompleteP,
    )
}


def names() -> list[str]:
    return list(FAMILIES)


def get(name: str) -> type[ResidualFamily]:
    if name not in FAMILIES:
        raise ConfigError(f"config.model.family: {name!r} is not one of {', '.join(FAMILIES)}")
    return FAMILIES[name]
