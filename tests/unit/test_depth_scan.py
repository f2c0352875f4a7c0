"""The depth-linear layer stack (model/depth_scan.py) needs less memory than nn.scan's.

That it computes nn.scan's loss and gradients (fp32, tight) for every family
with depth banks, in every grouping, with a skipped block, permuted blocks and
captured depth states in the loss: tests/unit/test_depth_valid.py."""

import jax
import jax.numpy as jnp
from flax import linen as nn

from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer
from depthbench.shapes import Shape


def test_depth_linear_compiles_less_temp_memory():
    """The XLA memory analysis of a train step: the depth-linear stack needs less
    temp memory than nn.scan's for a banked family at L8 (load-independent)."""
    def temp(layer_scan):
        spec = ModelSpec.from_shape(Shape(8, 16, 32, 2, 2, 32), family="attnres_full",
                                    layer_scan=layer_scan)
        model = Transformer(spec)
        tokens = jnp.zeros((2, 64), jnp.int32)
        params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), tokens)["params"]))
        grad = jax.grad(lambda p: jnp.mean(model.apply({"params": p}, tokens)[0]))
        return jax.jit(grad).lower(params).compile().memory_analysis().temp_size_in_bytes

    assert temp("depth_linear") < 0.8 * temp("carries")
