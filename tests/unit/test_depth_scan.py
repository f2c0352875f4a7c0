"""The depth-linear layer stack (model/depth_scan.py) equals nn.scan's.

Loss and gradients (fp32, tight) under ``model.layer_scan = "depth_linear"``
against ``"carries"`` for every family with depth banks, with a skipped
block, permuted blocks (``active``/``ident``) and captured depth states in
the loss, so each block's rebuilt carry (bank slots restored backwards,
attnres_block's running partial included) must be exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from noisy_params import init_perturbed

from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer, cross_entropy, family_of, permute_blocks
from depthbench.shapes import Shape

SHAPE = Shape(depth=4, d_model=16, d_ff=32, n_heads=2, n_kv_heads=2, vocab_size=32)
CASES = [
    ("attnres_full", ()),
    ("attnres_block", (("attnres_block_size", 3),)),  # blocks straddle transformer blocks
    ("moda", ()),
]


def _spec(family, fields, layer_scan):
    spec = ModelSpec.from_shape(SHAPE, family=family, layer_scan=layer_scan,
                                remat_policy="nothing_saveable")
    return spec.replace(residual=fields) if fields else spec


def _loss_and_grads(spec, tokens, params):
    model = Transformer(spec)
    order = jnp.array([2, 0, 3, 1])
    active = jnp.array([True, False, True, True])
    fam = family_of(spec)

    def loss(p):
        logits, cap = model.apply({"params": permute_blocks(fam, p, order)}, tokens,
                                  capture=("z",), active=active, ident=order)
        plain, _ = model.apply({"params": p}, tokens)
        return (cross_entropy(logits[:, :-1], tokens[:, 1:]) + 0.1 * jnp.mean(cap["z"]**2)
                + cross_entropy(plain[:, :-1], tokens[:, 1:]))

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("family,fields", CASES, ids=[c[0] for c in CASES])
def test_depth_linear_gradients_equal_nn_scan(family, fields):
    tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, SHAPE.vocab_size)
    # Nonzero queries everywhere, so no mix is a plain average.  Both stacks
    # read the same parameter tree (nn.scan's, made at init).
    params = init_perturbed(Transformer(_spec(family, fields, "carries")), tokens)
    loss_old, grads_old = _loss_and_grads(_spec(family, fields, "carries"), tokens, params)
    loss_new, grads_new = _loss_and_grads(_spec(family, fields, "depth_linear"), tokens, params)
    np.testing.assert_allclose(float(loss_new), float(loss_old), rtol=1e-6)
    flat_old = jax.tree_util.tree_leaves_with_path(grads_old)
    flat_new = jax.tree.leaves(grads_new)
    assert len(flat_old) == len(flat_new)
    for (path, g_old), g_new in zip(flat_old, flat_new, strict=True):
        scale = float(jnp.max(jnp.abs(g_old))) + 1e-12
        np.testing.assert_allclose(np.asarray(g_new) / scale, np.asarray(g_old) / scale,
                                   atol=2e-5, err_msg=jax.tree_util.keystr(path))
    # Something flowed into the family's own parameters.
    assert any(float(jnp.max(jnp.abs(g))) > 0 for p, g in flat_old if "residual" in str(p))


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
