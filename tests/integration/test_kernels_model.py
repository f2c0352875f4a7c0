"""``model.impl = pallas`` trains to the same losses as ``xla`` (kernels interpreted on CPU).

For attnres_full, attnres_block, hc and mhc (its default, Liger's form, and
mhc+pytorch): the same tiny model (depth 2,
width 32, 2 x 8 tokens, random routing parameters so no mix is trivial) is
trained a few SGD steps with each implementation from the same initial
parameters; the losses agree step by step and so do the final parameters.
Also: ``auto`` is ``xla`` on CPU, and the config accepts the three values.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from depthbench.config import ConfigError, apply_overrides, base_config, validate
from depthbench.model.residual.mhc import PYTORCH, PYTORCH_EARLY
from depthbench.model.residual.parts import fused
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer
from depthbench.shapes import Shape

SHAPE = Shape(depth=2, d_model=32, d_ff=64, n_heads=4, n_kv_heads=2, vocab_size=64)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 9)), jnp.int32)
STEPS = 3
FAST_COMPILE = {"xla_backend_optimization_level": 0}

FAMILIES = {
    "attnres_full": {},
    "attnres_block": {"attnres_blocks": 2},
    "hc": {"hc_n": 2},
    # the default mhc: Liger's form (linear Sinkhorn, R[out, in], bf16 phi)
    "mhc": {"hc_n": 2, "sinkhorn_iters": 4},
    "mhc+pytorch": {**PYTORCH, "hc_n": 2, "sinkhorn_iters": 4},
    # GQA in both depth groups: attention slots on 2 key heads, MLP slots on 1
    "moda": {"moda_kv_heads": 1},
}


def make_spec(family: str, impl: str) -> ModelSpec:
    spec = ModelSpec.from_shape(SHAPE, family=family.split("+")[0])
    residual = dict(spec.residual)
    residual.update(FAMILIES[family])
    return spec.replace(residual=tuple(sorted(residual.items())), impl=impl)


def perturbed(params, seed: int):
    """Every routing parameter moved off its init (zero queries, zero projections
    would make the mixes uniform or static and hide a wrong kernel)."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    out = [
        x + 0.3 * jax.random.normal(k, x.shape, x.dtype) if "residual" in path else x
        for k, x, path in zip(keys, leaves, paths, strict=True)
    ]
    return jax.tree.unflatten(tree, out)


def train(spec: ModelSpec, params):
    model = Transformer(spec)
    # Plain SGD: parameters move by lr * gradient, so parameter differences stay
    # gradient differences (Adam divides tiny gradients by their own RMS).
    opt = optax.sgd(0.5)

    def loss_fn(p):
        logits, _ = model.apply({"params": p}, TOKENS[:, :-1])
        labels = TOKENS[:, 1:]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def step(carry, _):
        p, state = carry
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, state = opt.update(grads, state, p)
        return (optax.apply_updates(p, updates), state), loss

    def run(p):
        (p, _), losses = jax.lax.scan(step, (p, opt.init(p)), None, length=STEPS)
        return losses, p

    return jax.jit(run).lower(params).compile(compiler_options=FAST_COMPILE)(params)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_pallas_trains_to_the_same_losses_as_xla(family):
    xla_spec = make_spec(family, "xla")
    init = Transformer(xla_spec).init(jax.random.key(0), TOKENS[:, :-1])
    params = perturbed(nn.unbox(init["params"]), seed=1)
    losses_xla, params_xla = train(xla_spec, params)
    losses_pallas, params_pallas = train(make_spec(family, "pallas"), params)
    assert np.all(np.isfinite(np.asarray(losses_xla)))
    np.testing.assert_allclose(losses_pallas, losses_xla, rtol=1e-5, atol=1e-6)
    assert float(losses_xla[-1]) < float(losses_xla[0])  # it did train
    for a, b in zip(jax.tree.leaves(params_pallas), jax.tree.leaves(params_xla), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_auto_is_xla_on_cpu_and_pallas_is_pallas():
    assert not fused.use_pallas(make_spec("hc", "auto"))
    assert fused.use_pallas(make_spec("hc", "pallas"))
    assert not fused.use_pallas(make_spec("hc", "xla"))


def test_pallas_runs_every_mhc_form_and_auto_is_xla_on_cpu():
    """The kernels compute every mhc form: ``impl=pallas`` accepts the default
    (Liger's), the PyTorch forms and tanh, and routes them through the kernels;
    ``auto`` validates and stays XLA on a CPU."""
    from depthbench.model.transformer import family_of

    liger = apply_overrides(base_config(), ["--config.model.family=mhc"])
    validate(apply_overrides(liger, ["--config.model.impl=pallas"]))
    validate(apply_overrides(liger, ["--config.model.impl=auto"]))
    for form in (PYTORCH, PYTORCH_EARLY, {"mhc_tanh": True}):
        validate(apply_overrides(liger, [f"--config.model.residual.{k}={v}" for k, v in
                                         form.items()] + ["--config.model.impl=pallas"]))
    spec = ModelSpec.from_shape(SHAPE, family="mhc")
    assert family_of(spec.replace(impl="pallas"))._pallas()
    assert family_of(spec.replace(impl="pallas").with_fields(**PYTORCH_EARLY))._pallas()
    assert not family_of(spec.replace(impl="auto"))._pallas()


def test_config_accepts_the_three_impls_and_refuses_others():
    for impl in fused.IMPLS:
        validate(apply_overrides(base_config(), [f"--config.model.impl={impl}"]))
    with pytest.raises(ConfigError, match="model.impl"):
        validate(apply_overrides(base_config(), ["--config.model.impl=triton"]))
