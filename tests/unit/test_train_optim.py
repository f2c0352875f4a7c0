"""The recipe's optimizer: schedule values, decay mask, AdamW equivalence, LR rules."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from depthbench import config as config_lib
from depthbench.config import ConfigError
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import family_of
from depthbench.shapes import Shape
from depthbench.train import optim
from depthbench.train.step import global_norm


def _config(**train):
    c = config_lib.base_config()
    for k, v in train.items():
        c.train[k] = v
    return c


def test_warmup_cosine_known_values():
    lr = optim.warmup_cosine(1e-3, steps=100, warmup_fraction=0.1, final_fraction=0.1)
    expect = {
        0: 0.0,  # warmup starts from 0
        5: 5e-4,
        10: 1e-3,  # peak at the end of warmup
        55: 1e-4 + 0.9e-3 * 0.5,  # half way through the cosine
        100: 1e-4,  # 0.1 x peak at the end
        150: 1e-4,  # and stays there
    }
    for step, value in expect.items():
        assert float(lr(step)) == pytest.approx(value, rel=1e-5, abs=1e-12), step
    s = 32
    cos = 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * (s - 10) / 90))
    assert float(lr(s)) == pytest.approx(cos, rel=1e-5)
    values = np.asarray(jax.jit(jax.vmap(lr))(jnp.arange(10, 101)))
    assert np.all(np.diff(values) <= 1e-12)  # monotone decay after warmup


def test_schedule_from_config_rounds_warmup_and_allows_none():
    c = _config(lr=2e-3, steps=300, warmup_fraction=0.1, final_lr_fraction=0.1)
    lr = optim.schedule_from_config(c)
    assert float(lr(30)) == pytest.approx(2e-3)
    assert float(lr(15)) == pytest.approx(1e-3)
    flat = optim.warmup_cosine(1.0, steps=10, warmup_fraction=0.0, final_fraction=0.5)
    assert float(flat(0)) == pytest.approx(1.0)
    assert float(flat(10)) == pytest.approx(0.5)


PARAMS = {
    "embed": jnp.ones((4, 2)),
    "blocks": {"attn_norm": jnp.ones((2, 2)), "mlp": {"up": jnp.ones((2, 2, 3))},
               "residual": {"A0": jnp.ones((2, 4, 5)), "beta0": jnp.ones((2, 4))}},
    "final_norm": {"scale": jnp.ones((2,))},
}


def test_decay_mask_exempts_family_and_configured_names():
    hc = family_of(ModelSpec.from_shape(Shape(2, 32, 64, 4, 4, 64), family="hc"))
    assert {"A0", "beta0"} <= set(hc.no_decay)
    mask = optim.decay_mask(PARAMS, optim.no_decay_names(_config(), hc))
    assert mask["blocks"]["residual"] == {"A0": False, "beta0": False}
    assert mask["embed"] and mask["blocks"]["mlp"]["up"] and mask["final_norm"]["scale"]
    extra = optim.no_decay_names(_config(no_decay="scale, attn_norm"), hc)
    mask = optim.decay_mask(PARAMS, extra)
    assert not mask["final_norm"]["scale"] and not mask["blocks"]["attn_norm"]
    assert mask["embed"]


def test_decay_is_decoupled_masked_and_scaled_by_lr():
    """Zero gradients: the update is exactly -lr * wd * p on decayed leaves, 0 elsewhere."""
    mask = optim.decay_mask(PARAMS, {"A0", "beta0"})
    tx = optim.adamw(lambda s: 0.5, weight_decay=0.1, mask=mask)
    state = tx.init(PARAMS)
    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    updates, _ = jax.jit(tx.update)(zeros, state, PARAMS)
    np.testing.assert_allclose(updates["embed"], -0.05 * np.ones((4, 2)), rtol=1e-6)
    np.testing.assert_allclose(updates["blocks"]["mlp"]["up"], -0.05, rtol=1e-6)
    np.testing.assert_array_equal(updates["blocks"]["residual"]["A0"], 0.0)
    np.testing.assert_array_equal(updates["blocks"]["residual"]["beta0"], 0.0)


def test_chain_equals_clip_plus_optax_adamw():
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), PARAMS)
    mask = optim.decay_mask(params, {"A0"})
    sched = optim.warmup_cosine(1e-2, steps=10)
    ours = optim.adamw(sched, mask=mask)
    ref = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(sched, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=mask))

    @jax.jit
    def both(g, s1, s2, p1, p2):
        u1, s1 = ours.update(g, s1, p1)
        u2, s2 = ref.update(g, s2, p2)
        return s1, s2, optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)

    s1, s2, p1, p2 = ours.init(params), ref.init(params), params, params
    for _ in range(4):  # gradient norms ~ 9: clipping is active
        g = jax.tree.map(lambda p: jnp.asarray(3 * rng.normal(size=p.shape), jnp.float32), params)
        s1, s2, p1, p2 = both(g, s1, s2, p1, p2)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not np.allclose(p1["embed"], params["embed"])


def test_clipping_bounds_the_first_adam_step_input():
    """Global-norm clipping at 1.0: a huge gradient is rescaled to norm 1 before Adam."""
    tx = optax.clip_by_global_norm(1.0)
    g = {"a": jnp.full((4,), 100.0)}
    clipped, _ = jax.jit(tx.update)(g, tx.init(g))
    assert float(global_norm(clipped)) == pytest.approx(1.0, rel=1e-6)


def test_completep_lr_rule_scales_block_updates_only():
    config = config_lib.base_config()
    config.model.family = "completep"
    config.model.residual.completep_alpha = 0.5
    config.model.residual.completep_base_depth = 2
    config.train.lr_rule = "family"
    spec = ModelSpec.from_shape(Shape(8, 32, 64, 4, 4, 64), family="completep",
                                residual=tuple(sorted(config.model.residual.to_dict().items())))
    fam = family_of(spec)
    mults = optim.lr_multipliers(config, fam, PARAMS)
    factor = (8 / 2) ** (0.5 - 1.0)  # (L / L_base)^(alpha - 1) = 0.5
    assert mults["blocks"]["mlp"]["up"] == pytest.approx(factor)
    assert mults["embed"] == 1.0 and mults["final_norm"]["scale"] == 1.0
    g = jax.tree.map(lambda p: jnp.full(p.shape, 0.01), PARAMS)
    plain = optim.adamw(lambda s: 1e-2, mask=optim.decay_mask(PARAMS))
    scaled = optim.adamw(lambda s: 1e-2, mask=optim.decay_mask(PARAMS), multipliers=mults)
    u0, _ = jax.jit(plain.update)(g, plain.init(PARAMS), PARAMS)
    u1, _ = jax.jit(scaled.update)(g, scaled.init(PARAMS), PARAMS)
    np.testing.assert_allclose(u1["blocks"]["mlp"]["up"], factor * u0["blocks"]["mlp"]["up"],
                               rtol=1e-6)
    np.testing.assert_allclose(u1["embed"], u0["embed"], rtol=1e-6)
    # lr_rule "none" ignores the family's rule.
    config.train.lr_rule = "none"
    assert optim.lr_multipliers(config, fam, PARAMS) is None


def test_lr_rule_needs_a_family_that_defines_it():
    config = _config(lr_rule="family")
    fam = family_of(ModelSpec.from_shape(Shape(2, 32, 64, 4, 4, 64), family="pre_ln"))
    with pytest.raises(ConfigError, match=r"config\.train\.lr_rule"):
        optim.lr_multipliers(config, fam, PARAMS)


def _completep(depth: int, base: int, alpha: float | None = None):
    config = config_lib.base_config()
    config.model.family = "completep"
    if alpha is not None:
        config.model.residual.completep_alpha = alpha
    config.model.residual.completep_base_depth = base
    spec = ModelSpec.from_shape(Shape(depth, 32, 64, 4, 4, 64), family="completep",
                                residual=tuple(sorted(config.model.residual.to_dict().items())))
    return config, family_of(spec)


@pytest.mark.parametrize(("depth", "base", "alpha"), [(16, 4, None), (16, 4, 0.5), (2, 8, 1.0),
                                                      (70, 16, 0.75)])
def test_completep_constants_follow_the_paper(depth, base, alpha):
    """Dey et al. 2025 (arXiv 2505.01618) and its code (nanoGPT-mup, completep):
    branch multiplier m_L^-alpha, hidden LR m_L^(alpha-1), AdamW eps * m_L^-alpha with
    m_L = L / L_base; alpha defaults to 1 (CompleteP), 0.5 is depth-muP."""
    config, fam = _completep(depth, base, alpha)
    a = 1.0 if alpha is None else alpha
    m = depth / base
    assert fam.alpha == a
    assert fam.multiplier == pytest.approx(m**-a, rel=1e-12)
    assert fam.hidden_lr == pytest.approx(m ** (a - 1.0), rel=1e-12)
    assert optim.adam_eps(config, fam, MODEL_PARAMS) == 1e-8  # the rule is off: the recipe's
    config.train.lr_rule = "family"
    eps = optim.adam_eps(config, fam, MODEL_PARAMS)
    # The original's groups (pretrain_preln_mup.py@aba1f65): eps * m^-alpha on the blocks,
    # the recipe's eps on the embedding, the head and the final norm.
    assert jax.tree.leaves(eps["blocks"]) == pytest.approx([1e-8 * m**-a] * 7, rel=1e-12)
    assert [eps["embed"], eps["head"], eps["final_norm"]["scale"]] == [1e-8] * 3


def test_completep_eps_reaches_adam():
    """The scaled epsilon is the one Adam divides by: with a gradient of the size
    of eps, the first update differs from the recipe's by exactly that factor."""
    config, fam = _completep(16, 4)
    config.train.lr_rule = "family"
    g = {"blocks": {"w": jnp.full((3,), 1e-8)}, "embed": jnp.full((2,), 1e-8)}
    eps = optim.adam_eps(config, fam, g)
    assert eps == {"blocks": {"w": pytest.approx(2.5e-9)}, "embed": 1e-8}
    tx = optim.adamw(lambda s: 1.0, eps=eps, weight_decay=0.0)
    u, state = jax.jit(tx.update)(g, tx.init(g), g)
    # First Adam step: m_hat = g, sqrt(v_hat) = |g|: update = -g / (|g| + eps).
    np.testing.assert_allclose(u["blocks"]["w"], -1e-8 / (1e-8 + 2.5e-9), rtol=1e-5)
    np.testing.assert_allclose(u["embed"], -1e-8 / (1e-8 + 1e-8), rtol=1e-5)
    # The state is optax's own Adam state, so checkpoints of either form restore alike.
    plain = optim.adamw(lambda s: 1.0, eps=1e-8, weight_decay=0.0)
    assert jax.tree.structure(state) == jax.tree.structure(plain.init(g))


MODEL_PARAMS = {
    "embed": jnp.ones((4, 2)),
    "head": jnp.ones((2, 4)),
    "blocks": {"attn_norm": jnp.ones((2, 2)), "mlp_norm": jnp.ones((2, 2)),
               "attn": {"q": jnp.ones((2, 2, 2))}, "mlp": {"up": jnp.ones((2, 2, 3))},
               "residual": {"A0": jnp.ones((2, 4, 5)), "W_a": jnp.ones((2, 2, 5)),
                            "attn_post_norm": jnp.ones((2, 2))}},
    "residual": {"query": jnp.ones((2,))},
    "final_norm": {"scale": jnp.ones((2,))},
}


def _mask(no_decay: str, family: str = "hc"):
    config = _config(no_decay=no_decay)
    fam = family_of(ModelSpec.from_shape(Shape(2, 32, 64, 4, 4, 64), family=family))
    return optim.decay_mask(MODEL_PARAMS, optim.no_decay_names(config, fam),
                            optim.no_decay_paths(config))


def test_no_decay_presets():
    assert config_lib.base_config().train.no_decay == "recipe"
    recipe = _mask("recipe")
    assert recipe["blocks"]["residual"] == {"A0": False, "W_a": True, "attn_post_norm": True}
    assert all(jax.tree.leaves({k: v for k, v in recipe.items() if k != "blocks"}))
    assert recipe["blocks"]["attn_norm"] and recipe["blocks"]["mlp"]["up"]
    assert _mask("") == recipe  # no preset named: the recipe
    alt = _mask("norms_embeddings_residual")
    assert not alt["embed"] and not alt["final_norm"]["scale"]
    assert not alt["blocks"]["attn_norm"] and not alt["blocks"]["mlp_norm"]
    assert not any(jax.tree.leaves(alt["blocks"]["residual"])) and not alt["residual"]["query"]
    assert alt["head"] and alt["blocks"]["attn"]["q"] and alt["blocks"]["mlp"]["up"]
    extra = _mask("recipe, scale")
    assert not extra["final_norm"]["scale"] and extra["embed"]


def test_no_decay_default_keeps_the_recipe_mask_and_rejects_unknown_names():
    c = _config()
    fam = family_of(ModelSpec.from_shape(Shape(2, 32, 64, 4, 4, 64), family="mhc"))
    tx, _ = optim.from_config(c, fam, MODEL_PARAMS)
    assert tx is not None
    with pytest.raises(ConfigError, match=r"config\.train\.no_decay: norms_embedings"):
        optim.from_config(_config(no_decay="norms_embedings"), fam, MODEL_PARAMS)


def test_the_originals_precision_bf16_weights_no_fp32_copy():
    """Under the paper suites' precision (``param_dtype`` bf16) the weights the
    original built in its model dtype are bf16 (matrices, embeddings, head, norm
    gains, mhc's phi) and stay bf16 through an AdamW step, whose moments take
    their dtype (no fp32 master copy); routing parameters the original kept
    fp32 (Liger's biases and gates) stay fp32."""
    from depthbench import parallel
    from depthbench.train import state as state_lib
    from depthbench.train import step as step_lib

    c = config_lib.load("micro", ["model.family=mhc", "model.depth=2", "model.param_dtype=bfloat16",
                                  "model.compute_dtype=bfloat16", "train.seq_len=16",
                                  "train.batch_size=2", "train.warmup_fraction=0.0"])
    s = state_lib.setup(c, parallel.mesh_from_config(c))
    state = state_lib.init_state(s, 0)

    def dtypes(tree):
        return {"/".join(str(k.key) for k in path): str(a.dtype)
                for path, a in jax.tree_util.tree_flatten_with_path(tree)[0]}

    params = dtypes(state.params)
    bf16 = {"embed", "head", "final_norm/scale", "blocks/attn/q", "blocks/mlp/down",
            "blocks/attn_norm", "blocks/mlp_norm", "blocks/residual/phi"}
    fp32 = {"blocks/residual/b_pre", "blocks/residual/B_res", "blocks/residual/a_res"}
    assert {params[k] for k in bf16} == {"bfloat16"} and {params[k] for k in fp32} == {"float32"}
    mu = next(s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: hasattr(x, "mu"))
              if hasattr(s, "mu")).mu
    assert dtypes(mu) == params  # Adam's moments in the parameters' dtypes
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 17)), jnp.int32)
    before = jax.tree.map(np.asarray, state.params)  # the step donates the state
    new, metrics = step_lib.make_train_step(s)(
        state, {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]})
    assert dtypes(new.params) == params and np.isfinite(float(metrics["loss"]))
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)), new.params, before)
    still = {"/".join(str(k.key) for k in p)
             for p, v in jax.tree_util.tree_flatten_with_path(moved)[0] if not v}
    # Every weight took its step in its own dtype, but the gates: they scale
    # phi's output, which is 0 at init, so their first gradient is 0.
    assert still == {"blocks/residual/a_pre", "blocks/residual/a_post", "blocks/residual/a_res"}
