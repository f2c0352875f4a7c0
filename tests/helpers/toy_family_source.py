"""The source of a residual family from outside the package, as a user would
write it (one module), for the plugin tests of both tiers
(tests/unit/test_family_plugin.py registers it in-process,
tests/integration/test_family_plugin_consumers.py through DEPTHBENCH_FAMILIES)."""

from __future__ import annotations

# The whole family: one module.  x <- x + toy_scale * g_j * F(N(x)) with a
# learned gain g_j per sublayer (init 1) on a logical axis of its own; a
# typed config with a variant, and cost terms.
TOY = '''
import dataclasses

from flax import linen as nn

from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.base import ResidualFamily, family_param, gate
from depthbench.model.residual.protocol.capabilities import CostTerms, Variants
from depthbench.model.residual.protocol.family_config import FamilyConfig, check_number


@dataclasses.dataclass(frozen=True)
class ToyConfig(FamilyConfig, Variants):
    toy_scale: float = 0.5
    toy_gain_init: float = 1.0

    variants = {"tiny_scale": {"toy_scale": 0.125}}

    def validate(self, config):
        check_number("toy_scale", self.toy_scale, 0.0, exclusive=True)


@registry.register
@dataclasses.dataclass(frozen=True)
class ToyScaled(ResidualFamily, CostTerms):
    name = "toy_scaled"
    description = "x <- x + toy_scale * g_j * F(N(x))"
    reference = "tests/helpers/toy_family_source.py"
    Config = ToyConfig
    sharding_rules = (("toy_gains", None),)

    def create_block_params(self, mod, ident):
        init = nn.initializers.constant(self.cfg.toy_gain_init)
        return {"gain": family_param(mod, "gain", init, (2,), ("toy_gains",))}

    def write(self, p, state, y, site, aux, active):
        scale = self.cfg.toy_scale * p["gain"][site.sub].astype(y.dtype)
        return gate(active, state + scale * y, state)

    def extra_block_params(self):
        return 2
'''
