"""Known answers for the routing families: hc, mhc, attnres_full, attnres_block, moda.

* at initialisation with pre_ln's sublayer weights, hc / mhc / attnres are
  pre_ln in disguise (spec/residuals.md, last section);
* Sinkhorn is doubly stochastic; a zero-query depth mix is a uniform average;
* attnres (full and block) equals a hand-written loop over its sources, and
  block size 1 equals full; moda equals a numpy attention whose one softmax
  covers sequence and depth keys;
* a skipped block is a removed block (attnres adds no source, moda writes no
  depth keys); parameter counts equal the cost model's.

Every model is depth 3 (depth 2 where a removed block is compared), width
32, vocabulary 64, 2 x 8 tokens; compiled functions are cached per spec.
"""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from kernel_checks import rel_err
from noisy_params import normal

from depthbench import costs
from depthbench.cli.families import family_rows
from depthbench.config import ConfigError, apply_overrides, base_config, validate
from depthbench.model.layers import MLP, Attention
from depthbench.model.residual import hc, moda
from depthbench.model.residual.parts import depth_mix, streams
from depthbench.model.residual.parts.sinkhorn import sinkhorn, sinkhorn_linear
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.base import Site
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer, family_of
from depthbench.shapes import Shape

ROUTING = ("hc", "mhc", "attnres_full", "attnres_block", "moda")
SHAPE = Shape(depth=3, d_model=32, d_ff=64, n_heads=4, n_kv_heads=2, vocab_size=64)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, SHAPE.vocab_size, (2, 8)), jnp.int32)
TINY_EPS = 1e-12  # makes RMSNorm exactly scale invariant (the known answers' premise)


def make_spec(family: str, depth: int = 3, **fields) -> ModelSpec:
    """The family at ``SHAPE`` (``depth``) with those of ``fields`` it has: its
    config's, and its analysis options (the others are another family's)."""
    shape = Shape(
        depth, SHAPE.d_model, SHAPE.d_ff, SHAPE.n_heads, SHAPE.n_kv_heads, SHAPE.vocab_size
    )
    spec = ModelSpec.from_shape(shape, family=family)
    options = registry.analysis_options()
    own = registry.get(family).config_fields()
    return spec.with_fields(**{k: v for k, v in fields.items() if k in own}).replace(
        analysis=tuple(sorted((k, v) for k, v in fields.items() if k in options)))


# XLA's lowest CPU optimisation level compiles these tiny models ~4x faster;
# every comparison below is between programs built the same way, or against
# references with tolerances far above the resulting rounding differences.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def fast_jit(fn):
    """``jax.jit`` that compiles with ``FAST_COMPILE``, once per argument signature."""
    jitted, compiled = jax.jit(fn), {}

    def call(*args):
        leaves, tree = jax.tree.flatten(args)
        key = (tree, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves))
        if key not in compiled:
            compiled[key] = jitted.lower(*args).compile(compiler_options=FAST_COMPILE)
        return compiled[key](*args)

    return call


@functools.cache
def init_params(spec: ModelSpec):
    init = fast_jit(lambda k: Transformer(spec).init(k, TOKENS))
    return nn.unbox(init(jax.random.key(1))["params"])


@functools.cache
def _apply(spec: ModelSpec, capture: bool):
    model = Transformer(spec)

    def fn(p, t, a):
        out, captured = model.apply({"params": p}, t, active=a, capture=("z",) * capture)
        return (out, captured["z"]) if capture else out

    return fast_jit(fn)


def logits(spec: ModelSpec, params, active=None, capture=False):
    """The logits, or ``(logits, z)`` with ``capture``."""
    active = np.ones((spec.depth,), bool) if active is None else np.asarray(active, bool)
    return _apply(spec, capture)(params, TOKENS, active)


def with_backbone(family_params, backbone_params):
    """``family_params`` with every backbone weight replaced by ``backbone_params``'."""
    out = dict(backbone_params)
    out["blocks"] = dict(backbone_params["blocks"])
    out["blocks"]["residual"] = family_params["blocks"]["residual"]
    if "residual" in family_params:
        out["residual"] = family_params["residual"]
    return out


def take_blocks(params, order):
    """Params of the model made of ``order``'s blocks (a shallower model)."""
    idx = np.asarray(order)
    return {**params, "blocks": jax.tree.map(lambda a: jax.device_put(np.asarray(a)[idx]),
                                             params["blocks"])}


def randomise(params, name: str, seed: int, scale: float = 1.0):
    """Replace every leaf called ``name`` under 'residual' by N(0, scale^2) draws."""
    rng = np.random.default_rng(seed)

    def walk(tree):
        return {
            k: (walk(v) if isinstance(v, dict) else normal(rng, v.shape, scale) if k == name else v)
            for k, v in tree.items()
        }

    out = dict(params)
    out["blocks"] = {**params["blocks"], "residual": walk(params["blocks"]["residual"])}
    if "residual" in params:
        out["residual"] = walk(params["residual"])
    return out


@pytest.fixture(scope="module")
def pre_ln():
    spec = make_spec("pre_ln")
    return spec, init_params(spec)


# ------------------------------------------------------------------ Sinkhorn


def test_sinkhorn_is_doubly_stochastic():
    run = fast_jit(lambda r, tau: sinkhorn(r, iters=20, temperature=tau))
    r = normal(np.random.default_rng(0), (64, 4, 4))
    p = run(r, 1.0)
    assert p.dtype == jnp.float32
    assert float(jnp.min(p)) >= 0.0
    np.testing.assert_allclose(jnp.sum(p, axis=-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(jnp.sum(p, axis=-2), 1.0, atol=1e-5)
    # Temperature divides the logits.
    np.testing.assert_allclose(run(2 * r, 2.0), p, atol=1e-6)
    # n = 1 is exactly 1, whatever the logit; bf16 logits still give fp32 output.
    assert float(run(jnp.full((1, 1), 3.7, jnp.bfloat16), 1.0)[0, 0]) == 1.0
    # mHC's initial B_res (0 on, -8 off the diagonal) gives nearly the identity.
    p0 = run(jnp.where(jnp.eye(4, dtype=bool), 0.0, -8.0), 1.0)
    off = math.exp(-8) / (1 + 3 * math.exp(-8))
    np.testing.assert_allclose(p0, jnp.where(jnp.eye(4, dtype=bool), 1 - 3 * off, off), rtol=1e-4)


def test_sinkhorn_matches_plain_log_domain_iteration():
    """sinkhorn's hand-written VJPs and short-axis sums against autodiff of the
    plain iteration (logsumexp over rows, then columns), values and gradients;
    n = 4 (elementwise sums) and n = 12 (reductions)."""

    def plain(r, iters):
        lp = r
        for _ in range(iters):
            lp = lp - jax.nn.logsumexp(lp, axis=-1, keepdims=True)
            lp = lp - jax.nn.logsumexp(lp, axis=-2, keepdims=True)
        return jnp.exp(lp)

    rng = np.random.default_rng(3)
    for n in (4, 12):
        r = normal(rng, (8, n, n)) * 2
        w = normal(rng, (8, n, n))
        ours = jax.jit(jax.value_and_grad(lambda r, w: jnp.sum(w * sinkhorn(r, iters=5))))(r, w)
        ref = jax.jit(jax.value_and_grad(lambda r, w: jnp.sum(w * plain(r, 5))))(r, w)
        np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ours[1], ref[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("iters,eps,tau", [(20, 1e-6, 1.0), (3, 1e-2, 0.5), (1, 1e-6, 1.0)])
def test_linear_sinkhorn_matches_autodiff_of_its_iteration(iters, eps, tau):
    """sinkhorn_linear (hand-written VJP: the iterations' inputs kept, run back
    in reverse) against autodiff of Liger's iteration written out, values and
    gradients; iters 1 (no loop), a temperature, Liger's eps and a large one."""

    def plain(r):
        p = jax.nn.softmax(r / tau, axis=-1) + eps
        p = p / (jnp.sum(p, axis=-2, keepdims=True) + eps)
        for _ in range(iters - 1):
            p = p / (jnp.sum(p, axis=-1, keepdims=True) + eps)
            p = p / (jnp.sum(p, axis=-2, keepdims=True) + eps)
        return p

    rng = np.random.default_rng(4)
    r, w = normal(rng, (2, 8, 4, 4)) * 3, normal(rng, (2, 8, 4, 4))
    ours = jax.jit(jax.value_and_grad(lambda r: jnp.sum(w * sinkhorn_linear(r, iters, eps, tau))))
    ref = jax.jit(jax.value_and_grad(lambda r: jnp.sum(w * plain(r))))
    (v_ours, g_ours), (v_ref, g_ref) = ours(r), ref(r)
    np.testing.assert_allclose(v_ours, v_ref, rtol=1e-5)
    np.testing.assert_allclose(g_ours, g_ref, rtol=1e-4, atol=1e-5)
    assert float(jnp.max(jnp.abs(g_ref))) > 1e-2  # the gradient is not vanishingly small


def test_stream_mix_and_write_match_autodiff_of_einsums():
    """streams.mix_streams / add_weighted (hand-written VJPs, sums over the
    stream axes as chains) against autodiff of the plain einsums, values and
    every gradient; m 1 (a read) and m 4 (a write), bf16 state included."""
    rng = np.random.default_rng(5)
    n, b, t, d = 4, 2, 3, 8
    for m, dtype in ((1, jnp.float32), (4, jnp.float32), (4, jnp.bfloat16)):
        c, w = normal(rng, (n, b, t, m)), normal(rng, (m, b, t))
        h, y = normal(rng, (n, b, t, d)).astype(dtype), normal(rng, (b, t, d))
        ct = normal(rng, (m, b, t, d))

        def ours(c, h, w, y, ct=ct):
            return jnp.sum(ct * streams.add_weighted(streams.mix_streams(c, h), w, y))

        def ref(c, h, w, y, ct=ct):
            mixed = jnp.einsum("sbtu,sbtd->ubtd", c, h.astype(jnp.float32))
            return jnp.sum(ct * (mixed + w[..., None] * y[None]))

        got = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2, 3)))(c, h, w, y)
        want = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2, 3)))(c, h, w, y)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
        for g_ours, g_ref in zip(got[1], want[1], strict=True):
            assert g_ours.dtype == g_ref.dtype
            np.testing.assert_allclose(np.asarray(g_ours, np.float32),
                                       np.asarray(g_ref, np.float32), rtol=1e-5, atol=1e-5)
    x = normal(rng, (n, b, t, d))
    np.testing.assert_allclose(streams.stream_sum(x), jnp.sum(x, axis=0), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------ init == pre_ln


def test_hc_at_init_is_pre_ln(pre_ln):
    pspec, pparams = pre_ln
    fam_params = init_params(make_spec("hc"))
    params = with_backbone(fam_params, pparams)
    ref = logits(pspec, pparams)
    # norm_then_sum: n equal streams, each normalised like pre_ln's state: exactly n times.
    normed = make_spec("hc", readout="norm_then_sum")
    np.testing.assert_allclose(logits(normed, params), 4 * ref, rtol=1e-5, atol=1e-6)
    # sum_then_norm (the default): N_out(n x) = N_out(x) when the norm is scale invariant.
    spec = make_spec("hc").replace(norm_eps=TINY_EPS)
    out = logits(spec, params)
    np.testing.assert_allclose(
        out, logits(pspec.replace(norm_eps=TINY_EPS), pparams), rtol=1e-5, atol=1e-6
    )
    # hc_n = 2 keeps the answer (a different A0, 2 streams).
    spec2 = make_spec("hc", hc_n=2, readout="norm_then_sum")
    params2 = with_backbone(init_params(spec2), pparams)
    np.testing.assert_allclose(logits(spec2, params2), 2 * ref, rtol=1e-5, atol=1e-6)


def test_mhc_at_init_is_nearly_pre_ln(pre_ln):
    pspec, pparams = pre_ln
    spec = make_spec("mhc", readout="sum_then_norm").replace(norm_eps=TINY_EPS)
    params = with_backbone(init_params(make_spec("mhc")), pparams)
    ref = logits(pspec.replace(norm_eps=TINY_EPS), pparams)
    err = rel_err(logits(spec, params), ref)
    # The spec allows 1e-2.  With equal streams the near-one-hot read gate only
    # rescales the read (sum of pre ~ 1.001, removed by N_j) and P's columns sum
    # to 1, so the streams stay equal: only rounding remains.
    assert err < 1e-4, err


@pytest.mark.parametrize(
    "family,fields",
    [
        ("attnres_full", {}),
        ("attnres_block", {}),  # default: 8 blocks -> S = ceil(6 / 8) = 1
        ("attnres_block", {"attnres_block_size": 2}),
        ("attnres_block", {"attnres_block_size": 4}),  # blocks of 4 and 2 (remainder)
        ("attnres_block", {"attnres_block_size": 7}),  # one block holds every sublayer
    ],
)
def test_attnres_at_init_is_pre_ln(pre_ln, family, fields):
    pspec, pparams = pre_ln
    spec = make_spec(family, attnres_eps=TINY_EPS, **fields).replace(norm_eps=TINY_EPS)
    params = with_backbone(init_params(make_spec(family)), pparams)
    ref = logits(pspec.replace(norm_eps=TINY_EPS), pparams)
    assert rel_err(logits(spec, params), ref) < 1e-4


# ------------------------------------------------------------------ attnres


def test_depth_mix_zero_query_is_uniform_average_and_matches_numpy():
    mix = fast_jit(functools.partial(depth_mix.depth_mix, eps=1e-6))
    rng = np.random.default_rng(3)
    bank = normal(rng, (5, 2, 3, 16))
    valid = jnp.array([True, True, True, False, False])
    out = mix(bank, valid, jnp.zeros(16), jnp.ones(16))
    np.testing.assert_allclose(out, jnp.mean(bank[:3], axis=0), rtol=1e-6, atol=1e-6)
    q, w = normal(rng, (16,)), 1 + normal(rng, (16,), 0.1)
    v = np.asarray(bank, np.float64)[:3]
    logit = np.einsum(
        "mbtd,d->mbt",
        v / np.sqrt(np.mean(v**2, -1, keepdims=True) + 1e-6),
        np.asarray(q * w, np.float64),
    )
    p = np.exp(logit - logit.max(0)) / np.exp(logit - logit.max(0)).sum(0)
    np.testing.assert_allclose(
        mix(bank, valid, q, w), np.einsum("mbt,mbtd->btd", p, v), rtol=1e-5, atol=1e-6
    )
    # bf16 sources are mixed in fp32: the same as mixing their fp32 values.
    b16 = bank.astype(jnp.bfloat16)
    np.testing.assert_array_equal(
        mix(b16, valid, q, w),
        mix(b16.astype(jnp.float32), valid, q, w).astype(jnp.bfloat16),
    )


def _rms_norm(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w


@functools.cache
def attnres_by_hand(spec: ModelSpec, sizes: tuple[int, ...]):
    return fast_jit(functools.partial(_attnres_by_hand, spec, sizes=sizes))


def _attnres_by_hand(spec: ModelSpec, params, sizes: tuple[int, ...]):
    """The spec's AttnRes written as a loop over sources: the bank starts [x0];
    sublayer j >= 1 mixes over bank + [partial]; when j starts a block (blocks
    of ``sizes`` sublayers, in order) the partial is committed first and a new
    one starts with y_j."""
    starts = set(np.cumsum((0, *sizes))[:-1].tolist())
    eps = family_of(spec).eps  # attnres_eps: key norms, the mixes' pre-norms, the final norm
    blocks = params["blocks"]
    pos = jnp.arange(TOKENS.shape[1])

    def mix(sources, q, w):
        v = jnp.stack(sources)
        logit = jnp.einsum("mbtd,d->mbt", v, q * w) * jax.lax.rsqrt(jnp.mean(v * v, -1) + eps)
        return jnp.einsum("mbt,mbtd->btd", jax.nn.softmax(logit, axis=0), v)

    bank, partial = [params["embed"][TOKENS]], None
    for j in range(2 * spec.depth):
        b, sub = divmod(j, 2)
        blk = jax.tree.map(lambda a, b=b: a[b], blocks)
        if j >= 1 and j in starts:
            bank, partial = bank + [partial], None
        sources = bank + ([] if partial is None else [partial])
        h = (
            bank[0]
            if j == 0
            else mix(sources, blk["residual"]["query"][sub], blk["residual"]["key_norm"][sub])
        )
        norm = blk["attn_norm" if sub == 0 else "mlp_norm"]
        x_in = _rms_norm(h, norm, spec.norm_eps if j == 0 else eps)  # x0 alone: the backbone's
        if sub == 0:
            y, _ = Attention(spec).apply({"params": blk["attn"]}, x_in, pos)
        else:
            y = MLP(spec).apply({"params": blk["mlp"]}, x_in)
        partial = y if partial is None else partial + y
    sources = bank + ([] if partial is None else [partial])
    x = mix(sources, params["residual"]["query"], params["residual"]["key_norm"])
    return _rms_norm(x, params["final_norm"]["scale"], eps) @ params["head"]


@pytest.mark.parametrize(
    "family,fields,sizes",
    [
        ("attnres_full", {}, (1,) * 6),
        ("attnres_block", {"attnres_block_size": 2}, (2, 2, 2)),
        ("attnres_block", {"attnres_block_size": 4}, (4, 2)),
        # N = 4 blocks over 6 sublayers: the original's S = ceil(6 / 4) = 2 ...
        ("attnres_block", {"attnres_blocks": 4}, (2, 2, 2)),
        # ... or exactly 4 blocks, the larger first (variant n_blocks)
        ("attnres_block", {"attnres_blocks": 4, "attnres_partition": "count"}, (2, 2, 1, 1)),
    ],
)
def test_attnres_equals_a_loop_over_sources(family, fields, sizes):
    spec = make_spec(family, **fields)
    params = randomise(randomise(init_params(make_spec(family)), "query", 7, 2.0), "key_norm", 8)
    out = logits(spec, params)
    assert family_of(spec).blocks == sizes
    np.testing.assert_allclose(out, attnres_by_hand(spec, sizes)(params), rtol=1e-4, atol=1e-5)
    # The queries matter: the uniform-average model gives other logits.
    uniform = init_params(make_spec(family))
    assert rel_err(logits(spec, with_backbone(uniform, params)), out) > 1e-3


def test_attnres_block_size_one_is_full():
    params = randomise(init_params(make_spec("attnres_full")), "query", 11, 2.0)
    full = logits(make_spec("attnres_full"), params)
    block = logits(make_spec("attnres_block", attnres_block_size=1), params)
    np.testing.assert_allclose(block, full, rtol=1e-6, atol=1e-6)
    assert family_of(make_spec("attnres_block")).blocks == (1,) * 6  # 2L = 6 < 8 blocks
    assert family_of(make_spec("attnres_block", depth=32)).blocks == (8,) * 8
    # 60 sublayers in blocks of S = ceil(60 / 8) = 8, the remainder last (the original's) ...
    assert family_of(make_spec("attnres_block", depth=30)).blocks == (8,) * 7 + (4,)
    # ... or in exactly 8 blocks, the first 60 mod 8 = 4 taking the extra one.
    assert family_of(make_spec("attnres_block", depth=30, attnres_partition="count")
                     ).blocks == (8,) * 4 + (7,) * 4


def test_attnres_block_has_exactly_n_blocks_at_every_suite_depth():
    """Wherever 2L >= N: exactly N blocks, sizes differing by at most one, the
    larger first, covering all 2L sublayers (ceil(2L / N) gave 7 at L14, L17, L21)."""
    from depthbench import shapes

    checked = 0
    for suite in shapes.SUITES.values():
        for depth, _, _ in suite.rows:
            for n in (4, 8, 12):
                if 2 * depth < n:
                    continue
                sizes = family_of(make_spec("attnres_block", depth=depth, attnres_blocks=n,
                                            attnres_partition="count")).blocks
                assert len(sizes) == n and sum(sizes) == 2 * depth, (suite.name, depth, n)
                assert max(sizes) - min(sizes) <= 1 and list(sizes) == sorted(sizes, reverse=True)
                checked += 1
    assert checked > 30
    layout = family_of(make_spec("attnres_block", depth=21, attnres_partition="count")).layout()
    assert layout == "2x6+6x5"  # two blocks of 6 sublayers, then six of 5


def test_attnres_block_partitions_as_the_original_by_default():
    """Blocks of S = ceil(2L / N) with a boundary at every sublayer j % S == 0, the
    remainder last (the original's ``attnres_is_attn_boundary``); the same
    partition as N equal blocks at the paper-400m depths L16..L32, not at L21."""
    from depthbench import shapes

    for depth, _, _ in shapes.suite("paper-400m").rows:
        sizes = family_of(make_spec("attnres_block", depth=depth)).blocks
        s = -(-2 * depth // 8)
        starts = np.cumsum((0, *sizes))[:-1].tolist()
        assert starts == [j for j in range(2 * depth) if j % s == 0], depth
        if depth <= 32:
            count = family_of(make_spec("attnres_block", depth=depth, attnres_partition="count"))
            assert sizes == count.blocks, depth
    assert family_of(make_spec("attnres_block", depth=21)).layout() == "7x6"  # 7 blocks, not 8
    assert family_of(make_spec("attnres_block", depth=17)).blocks == (5,) * 6 + (4,)


def test_attnres_last_depth_state_is_the_readout_mix():
    spec = make_spec("attnres_block", attnres_block_size=2)
    params = randomise(init_params(make_spec("attnres_block")), "query", 5, 2.0)
    out, z = logits(spec, params, capture=True)
    assert z.shape == (spec.depth + 1, 2, 8, spec.d_model)
    np.testing.assert_allclose(z[0], params["embed"][TOKENS], rtol=1e-6)  # one source: x0
    eps = family_of(spec).eps  # attnres_eps: the final norm is fused into the readout mix
    head = _rms_norm(z[-1], params["final_norm"]["scale"], eps) @ params["head"]
    np.testing.assert_allclose(head, out, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- skip


@pytest.mark.parametrize(
    "family,fields",
    [
        ("attnres_full", {}),
        ("attnres_block", {"attnres_block_size": 2}),
        ("moda", {}),
    ],
)
def test_skipped_block_is_a_removed_block(family, fields):
    """Depth 3 with block 1 skipped == the depth-2 model of blocks 0 and 2: attnres
    adds no source (the bank fills in execution order), moda writes no depth keys.
    For attnres that is the analysis option skip_rule="remove"; by default (the
    original benchmark's "next-output" rule) the mix after the skipped block
    returns the newest source instead, which differs."""
    params = init_params(make_spec(family))
    if family.startswith("attnres"):
        params = randomise(params, "query", 3, 2.0)
        default = logits(make_spec(family, **fields), params, active=[True, False, True])
        fields = {**fields, "skip_rule": "remove"}
    skipped = logits(make_spec(family, **fields), params, active=[True, False, True])
    removed = logits(make_spec(family, depth=2, **fields), take_blocks(params, [0, 2]))
    np.testing.assert_allclose(skipped, removed, rtol=1e-5, atol=1e-6)
    full = logits(make_spec(family, **fields), params)
    assert rel_err(full, removed) > 1e-4  # block 1 does something when it runs
    if family.startswith("attnres"):
        assert rel_err(default, removed) > 1e-4


def test_skipped_writes_leave_attnres_and_moda_state_unchanged():
    spec = make_spec("moda", moda_norm="post")
    fam, b, t = family_of(spec), 2, 8
    rng = np.random.default_rng(4)
    x0, y, x_in = (normal(rng, (b, t, spec.d_model)) for _ in range(3))
    kv = normal(rng, (2, b, t, spec.n_kv_heads, spec.head_dim))
    p = {"depth_kv": normal(rng, (spec.d_model, 2, fam.kv_heads, spec.head_dim))}
    p |= {k: np.ones((spec.d_model,), np.float32) for k in ("attn_post_norm", "mlp_post_norm")}

    @fast_jit
    def moda_writes(active):
        state = fam.init_state({}, x0)
        attn = fam.write(
            p, state, y, Site(0, jnp.int32(1), jnp.int32(1)), {"kv": (kv[0], kv[1])}, active
        )
        mlp = fam.write(p, state, y, Site(1, jnp.int32(1), jnp.int32(1)), {"x_in": x_in}, active)
        # The last block's MLP (block L - 1 >= L - 1 slots) writes nothing even when active.
        last = fam.write(p, state, y, Site(1, jnp.int32(2), jnp.int32(2)), {"x_in": x_in}, active)
        return state, attn, mlp, last

    state, *off = moda_writes(jnp.bool_(False))
    for out in off:
        chex.assert_trees_all_equal(out, state)
    state, attn, mlp, last = moda_writes(jnp.bool_(True))
    np.testing.assert_array_equal(attn["ka"][:, :, :, 1], kv[0])
    np.testing.assert_array_equal(attn["va"][:, :, :, 1], kv[1])
    assert np.asarray(mlp["valid"]).tolist() == [False, True]  # block 1 complete
    np.testing.assert_allclose(
        mlp["vf"][:, :, :, 1],
        jnp.einsum("btd,dkh->btkh", x_in, p["depth_kv"][:, 1]),
        rtol=1e-5,
        atol=1e-5,
    )
    # Post-norm: x <- N(x + y) with a unit gain.
    total = np.asarray(x0 + y, np.float64)
    expected = total / np.sqrt(np.mean(total**2, -1, keepdims=True) + spec.norm_eps)
    np.testing.assert_allclose(attn["x"], expected, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_equal({**last, "x": x0}, state)

    afam = family_of(make_spec("attnres_block", attnres_block_size=2))

    @fast_jit
    def attnres_writes(active):
        state = afam.init_state({}, x0)
        first = afam.write({}, state, y, Site(0, jnp.int32(0), jnp.int32(0)), {}, active)
        second = afam.write({}, first, 2 * y, Site(1, jnp.int32(0), jnp.int32(0)), {}, active)
        third = afam.write({}, second, 3 * y, Site(0, jnp.int32(1), jnp.int32(1)), {}, active)
        return state, third

    state, off = attnres_writes(jnp.bool_(False))
    # The bank and count stay; the skipped block is recorded for the next
    # consumer's "next-output" rule (the original benchmark's skip).
    assert int(off.pop("skipped")) == 1 and int(state.pop("skipped")) == 0
    chex.assert_trees_all_equal(off, state)
    _, on = attnres_writes(jnp.bool_(True))
    assert int(on["count"]) == 3 and int(on["skipped"]) == 0
    bank_mbtd = np.moveaxis(np.asarray(on["bank"]), afam.slot_axis, 0)
    np.testing.assert_allclose(bank_mbtd[1], 3 * y, rtol=1e-6)  # block 0: y + 2y
    np.testing.assert_allclose(bank_mbtd[2], 3 * y, rtol=1e-6)  # block 1's partial: 3y
    assert not np.any(bank_mbtd[3])


# ---------------------------------------------------------------------- moda


def _np_rope(x, theta=10000.0):
    t, half = x.shape[1], x.shape[-1] // 2
    ang = np.arange(t)[:, None] * theta ** (-np.arange(half) / half)
    sin, cos = np.sin(ang)[None, :, None], np.cos(ang)[None, :, None]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _np_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def moda_by_hand(spec: ModelSpec, params):
    """moda in float64 numpy: each attention concatenates its causal sequence
    logits (RoPE) with the depth logits of every earlier attention's k, v
    (``n_kv`` heads) and MLP k, v (``moda_kv_heads`` heads, unrotated) and
    takes one softmax; the depth logits use the rotated or unrotated query;
    the residual is post-norm ``N(x + F(x))`` or pre-norm ``x + F(N(x))``."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    eps, h, n = spec.norm_eps, spec.head_dim, spec.n_heads
    cfg = family_of(spec).cfg  # with the family's defaults for fields not given
    post = cfg.moda_norm == "post"
    rotated = cfg.moda_depth_query == "rotated"
    x = p["embed"][np.asarray(TOKENS)]
    t = x.shape[1]
    depth_k, depth_v = [], []  # per query head already: [B, T, n, h]

    def sublayer(x, blk, f, which):
        if post:
            return _np_norm(x + f(x), blk["residual"][f"{which}_post_norm"], eps)
        return x + f(_np_norm(x, blk[f"{which}_norm"], eps))

    for b in range(spec.depth):
        blk = jax.tree.map(lambda a, b=b: a[b], p["blocks"])
        a, kv_out = blk["attn"], []

        def attention(xin, a=a, kv_out=kv_out):
            q = np.einsum("btd,dnh->btnh", xin, a["q"])
            k = np.einsum("btd,dkh->btkh", xin, a["k"])
            v = np.einsum("btd,dkh->btkh", xin, a["v"])
            kv_out.extend([k, v])
            g = n // k.shape[2]
            seq = np.einsum("btnh,bsnh->bnts", _np_rope(q), np.repeat(_np_rope(k), g, 2))
            seq = np.where(np.tril(np.ones((t, t), bool)), seq / np.sqrt(h), -np.inf)
            qd = _np_rope(q) if rotated else q
            dep = [np.einsum("btnh,btnh->bnt", qd, dk)[..., None] / np.sqrt(h) for dk in depth_k]
            logit = np.concatenate([seq, *dep], axis=-1)
            w = np.exp(logit - logit.max(-1, keepdims=True))
            w = w / w.sum(-1, keepdims=True)
            out = np.einsum("bnts,bsnh->btnh", w[..., :t], np.repeat(v, g, axis=2))
            for i, dv in enumerate(depth_v):
                out = out + w[..., t + i].transpose(0, 2, 1)[..., None] * dv
            return np.einsum("btnh,nhd->btd", out, a["o"])

        mlp_in = []

        def mlp(xin, m=blk["mlp"], mlp_in=mlp_in):
            mlp_in.append(xin)
            hid = xin @ m["gate"]
            return ((hid / (1 + np.exp(-hid))) * (xin @ m["up"])) @ m["down"]

        x = sublayer(x, blk, attention, "attn")
        x = sublayer(x, blk, mlp, "mlp")
        kv = np.einsum("btd,dckh->cbtkh", mlp_in[0], blk["residual"]["depth_kv"])
        for k, v in (kv_out, kv):  # attention's depth keys first, then the MLP's
            depth_k.append(np.repeat(k, n // k.shape[2], axis=2))
            depth_v.append(np.repeat(v, n // v.shape[2], axis=2))
    return _np_norm(x, p["final_norm"]["scale"], eps) @ p["head"]


@pytest.mark.parametrize(
    "fields",
    [{}, {"moda_norm": "pre", "moda_depth_query": "unrotated", "moda_kv_heads": 0},
     {"moda_depth_query": "unrotated", "moda_kv_heads": 1}],
)
def test_moda_matches_a_loop_over_sequence_and_depth_keys(fields):
    spec = make_spec("moda", depth=3, **fields)
    params = init_params(spec)
    out = logits(spec, params)
    np.testing.assert_allclose(out, moda_by_hand(spec, params), rtol=1e-4, atol=1e-5)


def test_moda_block0_is_ordinary_attention(pre_ln):
    spec = make_spec("moda", depth=2, moda_norm="pre")
    params = init_params(spec)
    # Block 0 is ordinary causal attention: its depth state equals pre_ln's.
    pspec = make_spec("pre_ln", depth=2)
    backbone = take_blocks(pre_ln[1], [0, 1])
    mixed = with_backbone(params, backbone)
    _, z = logits(spec, mixed, capture=True)
    _, zp = logits(pspec, backbone, capture=True)
    np.testing.assert_allclose(z[1], zp[1], rtol=1e-5, atol=1e-6)
    assert rel_err(z[2], zp[2]) > 1e-4  # block 1 sees depth keys; pre_ln's does not


# --------------------------------------------------------- hc / mhc routing


def test_hc_and_mhc_init_follow_the_block_identity():
    n = 4
    hp = init_params(make_spec("hc"))["blocks"]["residual"]
    mp = init_params(make_spec("mhc"))["blocks"]["residual"]
    for b in range(3):
        for sub in range(2):
            k = (2 * b + sub) % n
            a0 = np.zeros((n, n + 1))
            a0[k, 0] = 1
            a0[:, 1:] = np.eye(n)
            np.testing.assert_array_equal(hp["A0"][b, sub], a0)
            np.testing.assert_array_equal(mp["b_pre"][b, sub], np.where(np.arange(n) == k, 8, -8))
    np.testing.assert_array_equal(hp["beta0"], 1.0)
    np.testing.assert_allclose(hp["s_a"], 0.01)
    assert not np.any(hp["W_a"]) and not np.any(hp["w_b"]) and not np.any(mp["phi"])
    np.testing.assert_array_equal(mp["B_res"][0, 0], np.where(np.eye(n, dtype=bool), 0, -8))
    np.testing.assert_array_equal(mp["b_post"], 0.0)
    np.testing.assert_allclose(mp["a_res"], 0.01)


def test_hc_mhc_output_projections_are_scaled_and_coefficients_fp32():
    for name in ("hc", "mhc"):
        fam = family_of(make_spec(name))
        assert fam.init_scale("o") == fam.init_scale("down") == 0.5  # 1 / sqrt(4)
        assert fam.init_scale("q") == fam.init_scale("up") == 1.0
    spec = make_spec("hc")
    params = init_params(spec)["blocks"]
    std = float(jnp.std(params["attn"]["o"]))
    assert std == pytest.approx(0.5 * 0.02 * 0.9866, rel=0.15)
    p0 = jax.tree.map(lambda a: a[0], params["residual"])
    rng = np.random.default_rng(1)
    p0 = {**p0, "W_a": normal(rng, p0["W_a"].shape)}
    h16 = normal(rng, (4, 2, 3, spec.d_model)).astype(jnp.bfloat16)
    a, beta = fast_jit(lambda p, h: family_of(spec).coefficients(p, h, 0))(p0, h16)
    assert a.dtype == beta.dtype == jnp.float32
    mspec = make_spec("mhc")
    m0 = jax.tree.map(lambda a: a[0], init_params(mspec)["blocks"]["residual"])
    pre, post, p = fast_jit(lambda p, h: family_of(mspec).coefficients(p, h, 1))(m0, h16)
    assert pre.dtype == post.dtype == p.dtype == jnp.float32
    np.testing.assert_allclose(jnp.sum(p, axis=0), 1.0, atol=1e-5)  # columns of P[s, t]


def test_hc_depth_state_concatenates_streams_and_the_readout_reads_them_out():
    spec = make_spec("hc", readout="sum_then_norm")
    params = init_params(make_spec("hc"))
    params = randomise(params, "W_a", 2, 0.5)  # the streams diverge
    out, z = logits(spec, params, capture=True)
    assert z.shape == (spec.depth + 1, 2, 8, 4 * spec.d_model)
    np.testing.assert_array_equal(z[0], jnp.tile(params["embed"][TOKENS], (1, 1, 4)))
    fam = family_of(spec)
    h_nbtd = jnp.moveaxis(z[-1].reshape(2, 8, 4, spec.d_model), 2, 0)
    assert rel_err(h_nbtd[0], h_nbtd[1]) > 1e-3
    x = fam.readout({}, h_nbtd, lambda r: _rms_norm(r, params["final_norm"]["scale"],
                                                    spec.norm_eps))
    np.testing.assert_allclose(x @ params["head"], out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ROUTING)
def test_bf16_compute_tracks_fp32(family):
    spec = make_spec(family)
    params = init_params(spec)
    ref = logits(spec, params)
    low = logits(spec.replace(compute_dtype="bfloat16"), params)
    assert low.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(low)))
    assert rel_err(low, ref) < 0.05


# -------------------------------------------------------------- costs, axes


@pytest.mark.parametrize("family", ROUTING)
def test_param_counts_match_costs_and_families_table(family):
    def count(spec):
        tree = jax.eval_shape(lambda k: Transformer(spec).init(k, TOKENS), jax.random.key(0))
        return sum(math.prod(x.shape) for x in jax.tree.leaves(tree["params"]))

    for spec in (make_spec(family), make_spec(family, depth=2, hc_n=2, attnres_block_size=3)):
        fam = family_of(spec)
        assert count(spec) == costs.param_count(spec)
        extra = count(spec) - count(spec.replace(family="pre_ln", residual=()))
        assert extra == spec.depth * fam.extra_block_params() + fam.extra_global_params()
    row = next(r for r in family_rows(64, 2) if r["name"] == family)
    shape = Shape(2, 64, 176, 16, 16, 50280)
    spec = ModelSpec.from_shape(shape, family=family)
    assert row["extra_block_params"] * 2 + row["extra_global_params"] == (
        count(spec) - count(spec.replace(family="pre_ln", residual=()))
    )


def test_documented_overheads_and_state_sizes():
    d, n, L = 1024, 4, 32  # noqa: E741
    shape = Shape(L, d, 2736, 16, 16, 50280)
    f = {name: family_of(ModelSpec.from_shape(shape, family=name)) for name in ROUTING}
    assert f["hc"].extra_block_params() == 2 * (n * (n + 2) + d * (n + 2) + 2)
    assert f["mhc"].extra_block_params() == 2 * (n * d * (n * n + 2 * n) + n * n + 2 * n + 3)
    assert f["attnres_full"].extra_block_params() == 2 * 2 * d
    assert f["attnres_full"].extra_global_params() == 2 * d
    hd = d // 16
    assert f["moda"].extra_block_params() == 2 * d * 16 * hd  # the backbone's 16 K/V heads
    lean = family_of(ModelSpec.from_shape(shape, family="moda").with_fields(moda_kv_heads=2))
    assert lean.extra_block_params() == 2 * d * 2 * hd  # moda+lean: 2 depth K/V heads
    assert f["hc"].state_floats_per_token() == f["mhc"].state_floats_per_token() == n * d
    assert f["attnres_full"].state_floats_per_token() == (2 * L + 1) * (d + 1)  # + inverse RMS
    assert f["attnres_block"].state_floats_per_token() == (8 + 1) * (d + 1)  # x0 + 8 blocks
    assert f["moda"].state_floats_per_token() == d + 2 * (L - 1) * (16 + 16) * hd
    assert lean.state_floats_per_token() == d + 2 * (L - 1) * (16 + 2) * hd
    assert f["attnres_full"].sources_per_token() == 2 * L * L + 3 * L
    assert f["moda"].extra_flops_per_token(128) == 4 * d * L * (L - 1) + (L - 1) * 2 * d * 32 * hd
    assert lean.extra_flops_per_token(128) == 4 * d * L * (L - 1) + (L - 1) * 2 * d * 4 * hd


def test_no_decay_leaves_and_logical_axes():
    for name in ROUTING:
        spec = make_spec(name)
        boxed = jax.eval_shape(lambda k, s=spec: Transformer(s).init(k, TOKENS), jax.random.key(0))[
            "params"
        ]
        leaves = {
            path[-1].key for path, _ in jax.tree_util.tree_flatten_with_path(nn.unbox(boxed))[0]
        }
        assert family_of(spec).no_decay <= leaves, name
        specs = nn.get_partition_spec(boxed)["blocks"]["residual"]
        for leaf, axes in jax.tree_util.tree_flatten_with_path(
            specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
        )[0]:
            assert tuple(axes)[0] == "layers", (name, leaf)
    specs = nn.get_partition_spec(
        jax.eval_shape(lambda k: Transformer(make_spec("mhc")).init(k, TOKENS), jax.random.key(0))[
            "params"
        ]
    )
    assert tuple(specs["blocks"]["residual"]["phi"]) == (
        "layers",
        None,
        "streams",
        "embed",
        "routing",
    )
    assert hc.HC.no_decay == {"A0", "beta0"}
    # Liger mHC (the default) trains its gates without decay; PyTorch mHC decays them.
    gates = {"a_pre", "a_post", "a_res"}
    assert family_of(make_spec("mhc")).no_decay == {"b_pre", "b_post", "B_res"} | gates
    assert family_of(make_spec("mhc", mhc_gate_decay=True)).no_decay == {"b_pre", "b_post",
                                                                         "B_res"}
    assert moda.MoDA(make_spec("moda")).n_slots == 2  # L - 1 of each kind (attention, MLP)


@pytest.mark.parametrize(
    "family,override,field",
    [
        ("mhc", {"model.residual.mhc_bias": -1.0}, "mhc_bias"),
        ("hc", {"model.residual.hc_n": 100}, "hc_n"),
        ("hc", {"model.residual.hc_scale_init": float("nan")}, "hc_scale_init"),
        ("attnres_block", {"model.residual.attnres_block_size": -2}, "attnres_block_size"),
        ("moda", {"model.residual.moda_kv_heads": 3}, "moda_kv_heads"),  # 4 heads at micro
        ("moda", {"model.residual.moda_norm": "mid"}, "moda_norm"),
        ("moda", {"model.residual.moda_depth_query": "sideways"}, "moda_depth_query"),
    ],
)
def test_validate_names_the_bad_field(family, override, field):
    config = apply_overrides(base_config(), {"model.family": family, **override})
    with pytest.raises(ConfigError, match=rf"config\.model\.residual\.{field}:"):
        validate(config)
    validate(apply_overrides(base_config(), {"model.family": family}))
