"""Backbone known answers: init, RoPE, GQA and depth attention, loss, scan/remat, permutation."""

import contextlib
import functools
import io
import math
import re

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from noisy_params import normal

from depthbench.model import layers
from depthbench.model.residual.parts.moda_attention import attention_with_depth
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer, cross_entropy, family_of, permute_blocks
from depthbench.shapes import Shape

TINY = Shape(depth=3, d_model=32, d_ff=96, n_heads=4, n_kv_heads=4, vocab_size=64)

# Everything below runs under jax.jit: eagerly, each primitive is compiled on its
# own (seconds per test on CPU); one program per computation is compiled once.


@functools.cache
def compiled(model: nn.Module, method: str = "apply", **kwargs):
    """``jax.jit(model.<method>)`` with ``kwargs`` bound, one per (model, method, kwargs);
    ``apply`` without a capture gives the logits alone."""
    fn = functools.partial(getattr(model, method), **kwargs)
    if method == "apply" and "capture" not in kwargs:
        return jax.jit(lambda *a, **k: fn(*a, **k)[0])
    return jax.jit(fn)


@pytest.fixture(scope="module")
def tiny():
    spec = ModelSpec.from_shape(TINY, "pre_ln")
    model = Transformer(spec)
    tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, TINY.vocab_size)
    params = nn.unbox(compiled(model, "init")(jax.random.key(1), tokens)["params"])
    apply = jax.jit(lambda p, t: model.apply({"params": p}, t)[0])
    return spec, model, tokens, params, apply


def test_trunc_normal_std_and_cutoff():
    w = layers.trunc_normal(0.02)(jax.random.key(0), (400, 400))
    assert float(jnp.max(jnp.abs(w))) <= 0.06 + 1e-7
    # std of N(0, 0.02) truncated at +-3 std is 0.02 * 0.9866.
    assert float(jnp.std(w)) == pytest.approx(0.02 * 0.9866, rel=0.01)


def test_rope_is_relative():
    """q.k after RoPE depends only on the position difference."""
    rng = np.random.default_rng(0)
    q, k = normal(rng, (1, 1, 1, 16)), normal(rng, (1, 1, 1, 16))

    @jax.jit
    def dot(pq, pk):
        return jnp.sum(layers.rope(q, pq[None], 10000.0) * layers.rope(k, pk[None], 10000.0))

    def score(pq, pk):
        return float(dot(jnp.int32(pq), jnp.int32(pk)))

    assert score(5, 3) == pytest.approx(score(12, 10), rel=1e-5)
    assert score(0, 0) == pytest.approx(float(np.sum(np.asarray(q) * np.asarray(k))), rel=1e-6)
    assert score(5, 3) != pytest.approx(score(5, 1), rel=1e-3)


def test_gqa_equals_mha_with_repeated_kv():
    """GQA with 2 KV heads equals MHA whose KV weights repeat each KV head."""
    gqa_spec = ModelSpec.from_shape(Shape(1, 32, 96, 4, 2, 64), "pre_ln")
    mha_spec = ModelSpec.from_shape(Shape(1, 32, 96, 4, 4, 64), "pre_ln")
    x = normal(np.random.default_rng(0), (2, 7, 32))
    pos = np.arange(7)
    gqa = layers.Attention(gqa_spec)

    @jax.jit
    def outputs(x, pos):
        p = nn.unbox(gqa.init(jax.random.key(1), x, pos)["params"])
        rep = {k: (jnp.repeat(v, 2, axis=1) if k in ("k", "v") else v) for k, v in p.items()}
        y_gqa, _ = gqa.apply({"params": p}, x, pos)
        y_mha, _ = layers.Attention(mha_spec).apply({"params": rep}, x, pos)
        return y_gqa, y_mha

    y_gqa, y_mha = outputs(x, pos)
    np.testing.assert_allclose(y_gqa, y_mha, rtol=1e-5, atol=1e-6)


def test_depth_attention_without_depth_keys_is_causal_attention():
    rng = np.random.default_rng(0)
    q, kk, v = normal(rng, (2, 5, 4, 8)), normal(rng, (2, 5, 2, 8)), normal(rng, (2, 5, 2, 8))
    ref = jax.jit(functools.partial(jax.nn.dot_product_attention, is_causal=True))(q, kk, v)
    dk = np.zeros((2, 5, 2, 3, 8), np.float32)  # [B, T, key heads, slots, d_h]
    none = np.zeros((3,), bool)
    groups = ((dk, dk, none), (dk[:, :, :1], dk[:, :, :1], none))
    out = jax.jit(attention_with_depth)(q, kk, v, q, groups)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("t", "blocks"), [(6, 1), (100, 1), (128, 2), (192, 3), (256, 4),
                                           (512, 8), (2048, 8), (2000, 8), (2001, 3)])
def test_query_blocks_split_evenly_into_at_least_min_rows(t, blocks):
    assert layers.query_blocks(t) == blocks
    assert t % blocks == 0 and (blocks == 1 or t // blocks >= layers.CAUSAL_BLOCK)


@pytest.mark.parametrize("block", [None, 2, 3, 4])  # None: one block (T 6 < 64); 4: no split
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_causal_attention_matches_jax_reference_values_and_grads(kv_heads, block, monkeypatch):
    if block is not None:  # query blocks that skip the keys above the diagonal
        monkeypatch.setattr(layers, "CAUSAL_BLOCK", block)
    rng = np.random.default_rng(3)
    q, kk, v = (normal(rng, (2, 6, heads, 8)) for heads in (4, kv_heads, kv_heads))

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda *a: jnp.sum(jnp.sin(fn(*a))), argnums=(0, 1, 2)))

    ref = loss(lambda *a: jax.nn.dot_product_attention(*a, is_causal=True))(q, kk, v)
    got = loss(layers.causal_attention)(q, kk, v)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
    for g, r in zip(got[1], ref[1], strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_swiglu_vjp_matches_autodiff_of_the_expression(dtype, tol):
    """The hand-written backward (it keeps only x, x W_g and x W_u) against
    autodiff of ``down(silu(x W_g) * (x W_u))``, values and all four gradients."""
    rng = np.random.default_rng(5)
    x = normal(rng, (2, 7, 16), dtype=dtype)
    wg, wu = (normal(rng, (16, 24), 0.3, dtype) for _ in range(2))
    wd = normal(rng, (24, 16), 0.3, dtype)

    def loss(fn):
        return jax.jit(jax.value_and_grad(
            lambda *a: jnp.sum(jnp.sin(fn(*a).astype(jnp.float32))), argnums=(0, 1, 2, 3)))

    ref = loss(lambda x, wg, wu, wd: (jax.nn.silu(x @ wg) * (x @ wu)) @ wd)(x, wg, wu, wd)
    got = loss(layers.swiglu)(x, wg, wu, wd)
    np.testing.assert_allclose(got[0], ref[0], rtol=tol)
    for g, r in zip(got[1], ref[1], strict=True):
        assert g.dtype == r.dtype
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32),
                                   rtol=tol, atol=tol)


def test_cross_entropy_gradient_is_softmax_minus_one_hot():
    logits = normal(np.random.default_rng(0), (2, 3, 5))
    targets = np.array([[0, 4, 2], [1, 1, 3]])
    grad = jax.jit(jax.grad(cross_entropy))(logits, targets)
    expected = (jax.nn.softmax(logits, -1) - jax.nn.one_hot(targets, 5)) / 6
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_cross_entropy_known_value():
    logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]]))
    targets = jnp.array([[0, 1]])
    expected = -(np.log(0.5) + np.log(0.8)) / 2
    loss = jax.jit(cross_entropy)
    assert float(loss(logits, targets)) == pytest.approx(expected, rel=1e-6)
    mask = jnp.array([[1, 0]])
    assert float(loss(logits, targets, mask)) == pytest.approx(-np.log(0.5), rel=1e-6)


def test_uniform_logits_at_init(tiny):
    """With std-0.02 weights the initial loss is close to log(V)."""
    spec, model, tokens, params, apply = tiny
    loss = jax.jit(cross_entropy)(apply(params, tokens)[:, :-1], tokens[:, 1:])
    assert float(loss) == pytest.approx(np.log(TINY.vocab_size), abs=0.05)


def test_causality(tiny):
    spec, model, tokens, params, apply = tiny
    t = 5
    other = tokens.at[:, t + 1 :].set((tokens[:, t + 1 :] + 7) % TINY.vocab_size)
    a, b = apply(params, tokens), apply(params, other)
    np.testing.assert_array_equal(a[:, : t + 1], b[:, : t + 1])
    assert float(jnp.max(jnp.abs(a[:, t + 1 :] - b[:, t + 1 :]))) > 0


def test_scan_vs_unrolled_and_remat(tiny):
    spec, model, tokens, params, apply = tiny
    ref = apply(params, tokens)
    for variant in (
        spec.replace(scan_unroll=spec.depth),
        spec.replace(remat_policy="none"),
        spec.replace(remat_policy="dots_saveable", scan_unroll=spec.depth),
    ):
        out = compiled(Transformer(variant))({"params": params}, tokens)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def _grads_and_residuals(spec, params, tokens):
    """Loss gradients under ``spec``'s remat policy, and the residuals the backward keeps."""
    model = Transformer(spec)

    def loss(p):
        return cross_entropy(model.apply({"params": p}, tokens[:, :-1])[0], tokens[:, 1:])

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        jax.ad_checkpoint.print_saved_residuals(loss, params)  # "f32[3,2,11,1] output of ..."
    shapes = [tuple(int(n) for n in m.group(1).split(",") if n)
              for m in re.finditer(r"^\w+\[([\d,]*)\]", printed.getvalue(), re.M)]
    return jax.jit(jax.grad(loss))(params), shapes


def test_matmuls_saveable_same_gradients_fewer_residuals(tiny):
    """matmuls_saveable: the gradients of remat off, from fewer kept values; it keeps
    attention's log-sum-exp ([L, B, K, blocks, rows]) and drops the norms' statistics
    ([L, B, T, 1]), which the backward recomputes."""
    spec, model, tokens, params, apply = tiny
    b, t = tokens.shape[0], tokens.shape[1] - 1
    off, off_saved = _grads_and_residuals(spec.replace(remat_policy="none"), params, tokens)
    new, new_saved = _grads_and_residuals(
        spec.replace(remat_policy="matmuls_saveable"), params, tokens)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), new, off)
    stat = (spec.depth, b, t, 1)
    lse = (spec.depth, b, spec.n_kv_heads, 1, t * spec.n_heads // spec.n_kv_heads)
    assert stat in off_saved and stat not in new_saved
    assert lse in new_saved
    weights = {leaf.shape for leaf in jax.tree.leaves(params)}
    size = lambda shapes: sum(math.prod(x) for x in shapes if x not in weights)  # noqa: E731
    assert size(new_saved) < 0.6 * size(off_saved), (size(new_saved), size(off_saved))


def test_determinism(tiny):
    spec, model, tokens, params, apply = tiny
    again = nn.unbox(compiled(model, "init")(jax.random.key(1), tokens)["params"])
    other = nn.unbox(compiled(model, "init")(jax.random.key(2), tokens)["params"])
    np.testing.assert_array_equal(apply(again, tokens), apply(params, tokens))
    assert float(jnp.max(jnp.abs(apply(other, tokens) - apply(params, tokens)))) > 1e-3


def test_skip_and_permute(tiny):
    """Skipping every block leaves the embedding; swapping blocks equals swapping params."""
    spec, model, tokens, params, apply = tiny
    skipped = compiled(model)({"params": params}, tokens, active=jnp.zeros((spec.depth,), bool))
    x0 = params["embed"][tokens]
    x = x0 * jax.lax.rsqrt(jnp.mean(x0**2, -1, keepdims=True) + spec.norm_eps)
    expected = (x * params["final_norm"]["scale"]) @ params["head"]
    np.testing.assert_allclose(skipped, expected, rtol=1e-5, atol=1e-6)

    order = jnp.array([2, 0, 1])
    permuted = jax.jit(functools.partial(permute_blocks, family_of(spec)))(params, order)
    swapped = compiled(model)({"params": permuted}, tokens, ident=order)
    # The same swap built by hand: a model whose block stack is stored in that order.
    by_hand = jax.tree.map(lambda a: np.asarray(a)[[2, 0, 1]], params["blocks"])
    manual = compiled(model)({"params": {**params, "blocks": by_hand}}, tokens)
    np.testing.assert_array_equal(swapped, manual)
    assert float(jnp.max(jnp.abs(swapped - apply(params, tokens)))) > 1e-4


def test_capture_returns_depth_states(tiny):
    spec, model, tokens, params, apply = tiny
    logits, captured = compiled(model, capture=("z",))({"params": params}, tokens)
    assert set(captured) == {"z"}  # what was asked, nothing else
    z = captured["z"]
    assert z.shape == (spec.depth + 1, 2, 12, spec.d_model)
    np.testing.assert_array_equal(z[0], params["embed"][tokens])
    np.testing.assert_allclose(logits, apply(params, tokens), rtol=1e-6, atol=1e-6)
    # pre_ln: the last depth state fed through N_out and the head gives the logits.
    zl = z[-1]
    x = zl * jax.lax.rsqrt(jnp.mean(zl**2, -1, keepdims=True) + spec.norm_eps)
    np.testing.assert_allclose(
        (x * params["final_norm"]["scale"]) @ params["head"], logits, rtol=1e-4, atol=1e-5
    )


def test_param_dtypes_and_logical_axes(tiny):
    spec, model, tokens, params, apply = tiny
    boxed = compiled(model, "init")(jax.random.key(1), tokens)["params"]
    specs = nn.get_partition_spec(boxed)
    assert tuple(specs["blocks"]["attn"]["q"]) == ("layers", "embed", "heads", "head_dim")
    assert tuple(specs["blocks"]["mlp"]["down"]) == ("layers", "mlp", "embed")
    assert tuple(specs["embed"]) == ("vocab", "embed")
    assert tuple(specs["head"]) == ("embed", "vocab")
    assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(params))
    bf16 = compiled(Transformer(spec.replace(compute_dtype="bfloat16")))({"params": params}, tokens)
    assert bf16.dtype == jnp.float32  # logits are returned in fp32
    np.testing.assert_allclose(bf16, apply(params, tokens), atol=0.05)
