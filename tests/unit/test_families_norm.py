"""Known answers for the norm-style families.

sandwich_ln, lns, deepnorm, keel, post_ln, mix_ln and completep are each
compared with a hand-written forward pass (the backbone's attention and MLP
as the sublayer functions, every norm and residual written out here), with
random weights of order one and random norm weights, so that a norm used in
the wrong place or a missing constant shows up in the logits.  Their
constants (alpha, beta, scales, multipliers) are checked against the
formulas of spec/residuals.md at several depths.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from depthbench.config import ConfigError, apply_overrides, base_config
from depthbench.config import validate as validate_config
from depthbench.model import layers
from depthbench.model.residual.completep import branch_multiplier, hidden_lr_multiplier
from depthbench.model.residual.deepnorm import deepnorm_alpha, deepnorm_beta
from depthbench.model.residual.lns import lns_scale
from depthbench.model.residual.mix_ln import post_ln_blocks
from depthbench.model.residual.protocol import registry
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer, family_of, permute_blocks
from depthbench.shapes import Shape

SHAPE = Shape(depth=4, d_model=32, d_ff=96, n_heads=4, n_kv_heads=4, vocab_size=64)
EPS = 1e-6
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
TOKENS = np.random.default_rng(5).integers(0, SHAPE.vocab_size, (2, 8)).astype(np.int32)


def make_spec(family: str, shape: Shape = SHAPE, **residual) -> ModelSpec:
    spec = ModelSpec.from_shape(shape, family=family)
    return spec.replace(residual=tuple(sorted({**dict(spec.residual), **residual}.items())))


def random_params(spec: ModelSpec, seed: int = 0):
    """Parameters with the model's tree: matrices N(0, 0.2^2), embeddings
    N(0, 1), norm weights 1 + N(0, 0.2^2) (so each norm's weight matters)."""
    boxed = jax.eval_shape(Transformer(spec).init, jax.random.key(0), TOKENS)["params"]
    rng = np.random.default_rng(seed)

    def fill(path, box):
        names, shape = tuple(box.names), box.value.shape
        if names[-1] == "norm":
            draw = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            std = 1.0 if jax.tree_util.keystr(path).startswith("['embed']") else 0.2
            draw = std * rng.standard_normal(shape)
        return jax.device_put(draw.astype(np.float32))  # jnp.asarray: a program per shape

    return jax.tree_util.tree_map_with_path(fill, boxed, is_leaf=lambda x: isinstance(
        x, nn.Partitioned))


def init_params(spec: ModelSpec):
    """The model's own initialisation (boxed, with logical names)."""
    init = jax.jit(Transformer(spec).init).lower(jax.random.key(0), TOKENS).compile(FAST)
    return init(jax.random.key(0), TOKENS)["params"]


@functools.cache
def compiled_forward(spec: ModelSpec):
    """``(params, ident) -> logits`` on TOKENS, compiled once per spec."""
    model = Transformer(spec)
    params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), TOKENS)["params"]))
    ident = jax.ShapeDtypeStruct((spec.depth,), jnp.int32)
    return jax.jit(lambda p, i: model.apply({"params": p}, TOKENS, ident=i)[0]).lower(
        params, ident).compile(FAST)


def model_logits(spec: ModelSpec, params, ident=None):
    ident = np.arange(spec.depth) if ident is None else ident
    return compiled_forward(spec)(params, jnp.asarray(ident, jnp.int32))


# ------------------------------------------------------ the hand-written side


def rms(x, w):
    return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + EPS) * w


def ln(x, w):
    c = x - jnp.mean(x, -1, keepdims=True)
    return c / jnp.sqrt(jnp.mean(c * c, -1, keepdims=True) + EPS) * w


def reference_logits(spec: ModelSpec, params, block_fn):
    """Embedding -> ``block_fn(b, x, attn, mlp, bp)`` for each block -> N_out -> head."""
    attn_mod, mlp_mod = layers.Attention(spec), layers.MLP(spec)
    positions = jnp.arange(TOKENS.shape[1])
    x = params["embed"][TOKENS]
    for b in range(spec.depth):
        bp = jax.tree.map(lambda a, b=b: a[b], params["blocks"])

        def attn(h, bp=bp):
            return attn_mod.apply({"params": bp["attn"]}, h, positions)[0]

        def mlp(h, bp=bp):
            return mlp_mod.apply({"params": bp["mlp"]}, h)

        x = block_fn(b, x, attn, mlp, bp)
    return rms(x, params["final_norm"]["scale"]) @ params["head"]


def assert_matches(spec, params, block_fn, ident=None):
    """The model equals the hand-written forward; with ``ident``, ``params`` hold
    permuted blocks and ``block_fn`` sees positions (its ``b``)."""
    got = model_logits(spec, params, ident)
    want = jax.jit(lambda p: reference_logits(spec, p, block_fn))(params)  # one program
    assert float(jnp.std(want)) > 0.1  # the comparison is not between near-zero logits
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


# ------------------------------------------------------------ sandwich_ln


def test_sandwich_ln_matches_reference():
    """x <- x + N'(F(N(x))) for both sublayers of every block."""
    spec = make_spec("sandwich_ln")
    params = random_params(spec)

    def block(b, x, attn, mlp, bp):
        r = bp["residual"]
        x = x + rms(attn(rms(x, bp["attn_norm"])), r["attn_post_norm"])
        return x + rms(mlp(rms(x, bp["mlp_norm"])), r["mlp_post_norm"])

    assert_matches(spec, params, block)


def test_sandwich_ln_second_norm_starts_at_one():
    boxed = init_params(make_spec("sandwich_ln"))
    for k in ("attn_post_norm", "mlp_post_norm"):
        assert tuple(boxed["blocks"]["residual"][k].names) == ("layers", "norm")
        np.testing.assert_array_equal(boxed["blocks"]["residual"][k].value, 1.0)


# ------------------------------------------------------------------- lns


def test_lns_scale_values():
    np.testing.assert_allclose(lns_scale(jnp.arange(4), 0.5),
                               [1.0, 1 / math.sqrt(2), 1 / math.sqrt(3), 0.5], rtol=1e-6)
    np.testing.assert_allclose(lns_scale(jnp.arange(3), 1.0), [1.0, 0.5, 1 / 3], rtol=1e-6)


@pytest.mark.parametrize("power", [0.5, 1.0])
def test_lns_matches_reference_and_scale_moves_with_block(power):
    """x <- x + F(N(x) / l^p) with l the block's identity + 1, also after a permutation."""
    spec = make_spec("lns", lns_power=power)
    params = random_params(spec)

    def block_with(idents):
        def block(b, x, attn, mlp, bp):
            s = (idents[b] + 1.0) ** -power
            x = x + attn(rms(x, bp["attn_norm"]) * s)
            return x + mlp(rms(x, bp["mlp_norm"]) * s)
        return block

    assert_matches(spec, params, block_with([0, 1, 2, 3]))
    order = np.array([3, 1, 0, 2])  # block 3 runs first and keeps 1/sqrt(4)
    permuted = permute_blocks(family_of(spec), params, order)
    assert_matches(spec, permuted, block_with(order), ident=order)


# --------------------------------------------------------------- deepnorm


@pytest.mark.parametrize("depth", [1, 4, 16, 70])
def test_deepnorm_constants(depth):
    fam = family_of(make_spec("deepnorm", at_depth(depth)))
    assert fam.alpha == pytest.approx((2 * depth) ** 0.25, rel=1e-12)
    assert fam.beta == pytest.approx((8 * depth) ** -0.25, rel=1e-12)
    assert deepnorm_alpha(4) == pytest.approx(8 ** 0.25) and deepnorm_beta(4) == pytest.approx(
        32 ** -0.25)
    for m in ("v", "o", "gate", "up", "down"):
        assert fam.init_scale(m) == fam.beta
    assert fam.init_scale("q") == fam.init_scale("k") == 1.0
    fixed = family_of(make_spec("deepnorm", at_depth(depth), deepnorm_alpha=3.0,
                                deepnorm_beta=0.5))
    assert (fixed.alpha, fixed.beta) == (3.0, 0.5)


def at_depth(depth: int) -> Shape:
    return Shape(depth, SHAPE.d_model, SHAPE.d_ff, SHAPE.n_heads, SHAPE.n_kv_heads,
                 SHAPE.vocab_size)


def test_deepnorm_matches_reference():
    """x <- LN(alpha x + F(x)), no pre-norm, mean-centred LN without bias."""
    spec = make_spec("deepnorm")
    params = random_params(spec)
    alpha = (2 * spec.depth) ** 0.25
    assert "attn_norm" not in params["blocks"]  # no pre-norm parameters

    def block(b, x, attn, mlp, bp):
        r = bp["residual"]
        x = ln(alpha * x + attn(x), r["attn_post_ln"])
        return ln(alpha * x + mlp(x), r["mlp_post_ln"])

    assert_matches(spec, params, block)


def test_deepnorm_init_std():
    """v, o and the MLP matrices start with std beta * 0.02; q and k with 0.02."""
    spec = make_spec("deepnorm", Shape(4, 64, 176, 4, 4, 64))
    params = nn.unbox(init_params(spec))
    beta = (8 * 4) ** -0.25
    trunc = 0.02 * 0.98658  # std of N(0, 0.02^2) truncated at +-3 std
    stds = {k: float(np.std(np.asarray(v))) for k, v in {**params["blocks"]["attn"],
                                             **params["blocks"]["mlp"]}.items()}
    for k in ("v", "o", "gate", "up", "down"):
        assert stds[k] == pytest.approx(beta * trunc, rel=0.04), (k, stds[k])
    for k in ("q", "k"):
        assert stds[k] == pytest.approx(trunc, rel=0.04), (k, stds[k])


# ------------------------------------------------------------------- keel


@pytest.mark.parametrize("depth", [1, 4, 16, 70])
def test_keel_alpha(depth):
    assert family_of(make_spec("keel", at_depth(depth))).alpha == 2 * depth
    assert family_of(make_spec("keel", at_depth(depth), keel_alpha=5.0)).alpha == 5.0


def test_keel_matches_reference():
    """Block 0: h = x + Attn(N_a x), out = N_pf(h + MLP(N_f h));
    b > 0: h = N_pa(alpha x + Attn(N_a x)), out = N_pf(alpha h + MLP(N_f h))."""
    spec = make_spec("keel")
    params = random_params(spec)
    alpha = 2.0 * spec.depth

    def block(b, x, attn, mlp, bp):
        r = bp["residual"]
        if b == 0:
            h = x + attn(rms(x, bp["attn_norm"]))
            return rms(h + mlp(rms(h, bp["mlp_norm"])), r["mlp_post_norm"])
        h = rms(alpha * x + attn(rms(x, bp["attn_norm"])), r["attn_post_norm"])
        return rms(alpha * h + mlp(rms(h, bp["mlp_norm"])), r["mlp_post_norm"])

    assert_matches(spec, params, block)
    # "Block 0" is the first position: a permuted stack keeps the structure in place.
    order = np.array([2, 0, 3, 1])
    assert_matches(spec, permute_blocks(family_of(spec), params, order), block, ident=order)


# ---------------------------------------------------------- post_ln, mix_ln


def test_post_ln_matches_reference():
    spec = make_spec("post_ln")
    params = random_params(spec)
    assert "attn_norm" not in params["blocks"]

    def block(b, x, attn, mlp, bp):
        r = bp["residual"]
        x = rms(x + attn(x), r["attn_post_norm"])
        return rms(x + mlp(x), r["mlp_post_norm"])

    assert_matches(spec, params, block)


@pytest.mark.parametrize(("depth", "fraction", "n_post"), [
    (4, 0.25, 1), (2, 0.25, 1), (10, 0.25, 3), (16, 0.25, 4), (70, 0.25, 18), (1, 0.25, 0),
    (8, 0.0, 0), (8, 1.0, 8), (8, 0.5, 4)])
def test_mix_ln_post_blocks(depth, fraction, n_post):
    assert post_ln_blocks(depth, fraction) == n_post
    fam = family_of(make_spec("mix_ln", at_depth(depth), mix_ln_fraction=fraction))
    assert fam.n_post == n_post


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_mix_ln_matches_reference(fraction):
    """Depth 4: the first round(f L) blocks are post-LN, the rest pre-LN."""
    spec = make_spec("mix_ln", mix_ln_fraction=fraction)
    params = random_params(spec)
    n_post = {0.25: 1, 0.5: 2}[fraction]

    def block(b, x, attn, mlp, bp):
        r = bp["residual"]
        if b < n_post:
            x = rms(x + attn(x), r["attn_norm"])
            return rms(x + mlp(x), r["mlp_norm"])
        x = x + attn(rms(x, r["attn_norm"]))
        return x + mlp(rms(x, r["mlp_norm"]))

    assert_matches(spec, params, block)
    # Post- or pre-LN is decided by position: a permuted block takes its slot's placement.
    order = np.array([3, 2, 1, 0])
    assert_matches(spec, permute_blocks(family_of(spec), params, order), block, ident=order)


# -------------------------------------------------------------- completep


@pytest.mark.parametrize(("depth", "base", "alpha", "branch", "lr"), [
    (4, 4, 0.5, 1.0, 1.0), (16, 4, 0.5, 0.5, 0.5), (64, 4, 0.5, 0.25, 0.25),
    (16, 4, 1.0, 0.25, 1.0), (2, 4, 1.0, 2.0, 1.0), (2, 8, 0.5, 2.0, 2.0)])
def test_completep_multipliers(depth, base, alpha, branch, lr):
    assert branch_multiplier(depth, base, alpha) == pytest.approx(branch, rel=1e-12)
    assert hidden_lr_multiplier(depth, base, alpha) == pytest.approx(lr, rel=1e-12)
    fam = family_of(make_spec("completep", at_depth(depth), completep_alpha=alpha,
                              completep_base_depth=base))
    assert (fam.multiplier, fam.hidden_lr) == pytest.approx((branch, lr), rel=1e-12)


def test_completep_lr_multipliers_tree():
    spec = make_spec("completep", at_depth(16), completep_alpha=0.5)
    params = random_params(make_spec("completep"))  # the tree's keys, not its depth, matter
    mult = family_of(spec).lr_multipliers(params)
    assert jax.tree.structure(mult) == jax.tree.structure(params)
    for k in ("embed", "head"):
        assert mult[k] == 1.0
    assert mult["final_norm"]["scale"] == 1.0
    block_leaves = jax.tree.leaves(mult["blocks"])
    assert len(block_leaves) == 9 and all(m == 0.5 for m in block_leaves)  # (16/4)^-0.5


def test_completep_matches_reference():
    """x <- x + (L / L_base)^-alpha F(N(x)); L 4, L_base 1, alpha 0.5: multiplier 1/2."""
    spec = make_spec("completep", completep_base_depth=1, completep_alpha=0.5)
    params = random_params(spec)

    def block(b, x, attn, mlp, bp):
        x = x + 0.5 * attn(rms(x, bp["attn_norm"]))
        return x + 0.5 * mlp(rms(x, bp["mlp_norm"]))

    assert_matches(spec, params, block)


# -------------------------------------------------------------- validation


@pytest.mark.parametrize(("field", "value"), [
    ("lns_power", -0.5), ("deepnorm_alpha", -1.0), ("deepnorm_beta", float("nan")),
    ("keel_alpha", -2.0), ("mix_ln_fraction", 1.5), ("completep_alpha", 2.0),
    ("completep_alpha", 0.25), ("completep_base_depth", 0)])
def test_validate_rejects_out_of_range(field, value):
    family = {"lns": "lns", "deepnorm": "deepnorm", "keel": "keel", "mix": "mix_ln",
              "completep": "completep"}[field.split("_")[0]]
    config = apply_overrides(base_config(), {"model.family": family,
                                             f"model.residual.{field}": value})
    with pytest.raises(ConfigError, match=f"model.residual.{field}"):
        registry.family_config(family, config.model.residual.to_dict()).validate(config)
    with pytest.raises(ConfigError, match=f"model.residual.{field}"):
        validate_config(config)  # the loader's path reaches the family's check
