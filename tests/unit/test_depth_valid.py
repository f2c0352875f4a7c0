"""Mixing only the slots that can be valid (issue 13): the depth-linear stack's
position groups, the families' ``bank_extent`` bounds, attnres's hand-written
``depth_mix`` VJP and moda's grouped-head depth attention, each against a
plain reference (fp32, tight)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from noisy_params import init_perturbed, normal

from depthbench.model import depth_scan, layers
from depthbench.model.residual import moda
from depthbench.model.residual.parts import depth_mix
from depthbench.model.residual.parts.moda_attention import attention_with_depth
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer, cross_entropy, family_of, permute_blocks
from depthbench.shapes import Shape
from pallas_kernels import merge_partial


@pytest.mark.parametrize("depth,groups", [(1, 4), (4, 4), (5, 2), (7, 3), (32, 4)])
def test_position_groups_cover_the_stack_in_near_equal_spans(depth, groups):
    spans = depth_scan.position_groups(depth, groups)
    assert spans[0][0] == 0 and spans[-1][1] == depth
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    lengths = [e - s for s, e in spans]
    assert len(spans) == min(groups, depth) and max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)


@pytest.mark.parametrize("depth,expected", [(3, 1), (8, 2), (17, 4), (32, 8), (70, 8)])
def test_default_groups_keep_min_span_positions_each(depth, expected, monkeypatch):
    monkeypatch.setattr(depth_scan, "GROUPS", 8)
    monkeypatch.setattr(depth_scan, "MIN_SPAN", 4)
    assert len(depth_scan.position_groups(depth)) == expected


@pytest.mark.parametrize("family,spans", [("attnres_full", 8), ("moda", 4)])
def test_groups_that_cut_alike_run_as_one_scan(family, spans):
    """attnres_full's extent grows with depth: 8 groups at L 32; moda's caches
    are cut by whole chunks of 8 slots: the groups holding the same chunks
    run as one scan, 4 at L 32."""
    spec = ModelSpec.from_shape(Shape(32, 16, 32, 2, 2, 32), family=family)
    fam = family_of(spec)
    state0 = fam.init_state({}, jnp.zeros((1, 2, 16)))
    plan = depth_scan._plan(fam.bank_slots, state0, jnp.arange(32), fam.bank_extent)
    assert len(plan.spans) == spans and plan.spans[0][0] == 0 and plan.spans[-1][1] == 32
    assert all(a[1] == b[0] for a, b in zip(plan.spans, plan.spans[1:], strict=False))


GROUPED = Shape(depth=5, d_model=16, d_ff=32, n_heads=2, n_kv_heads=2, vocab_size=32)


def _grouped_spec(family, layer_scan):
    spec = ModelSpec.from_shape(GROUPED, family=family, layer_scan=layer_scan)
    if family == "attnres_block":  # blocks of 3 sublayers straddle transformer blocks
        spec = spec.replace(residual=(("attnres_block_size", 3),))
    return spec


def _grouped_loss_and_grads(family, layer_scan, tokens, params):
    """Loss and gradients through a skipped and a permuted block, with the
    captured depth states in the loss: every block's rebuilt carry (bank slots
    restored backwards, attnres_block's running partial included) and every
    captured state must be exact."""
    spec = _grouped_spec(family, layer_scan)
    model, fam = Transformer(spec), family_of(spec)
    order = jnp.array([1, 0, 2, 4, 3])
    active = jnp.array([True, True, False, True, True])

    def loss(p):
        logits, captured = model.apply({"params": permute_blocks(fam, p, order)}, tokens,
                                       active=active, ident=order, capture=("z",))
        return (cross_entropy(logits[:, :-1], tokens[:, 1:])
                + 0.1 * jnp.mean(captured["z"] ** 2))

    return jax.jit(jax.value_and_grad(loss))(params)


@functools.cache
def _grouped_reference(family):
    """Tokens, perturbed parameters (nonzero queries everywhere, so no mix is a
    plain average) and nn.scan's loss and gradients: the same for every
    grouping (only the depth-linear stack reads ``GROUPS``)."""
    tokens = jax.random.randint(jax.random.key(0), (2, 6), 0, 32)
    params = init_perturbed(Transformer(_grouped_spec(family, "carries")), tokens)
    return tokens, params, _grouped_loss_and_grads(family, "carries", tokens, params)


def _assert_same_loss_and_gradients(new, reference):
    (loss_new, grads_new), (loss_old, grads_old) = new, reference
    np.testing.assert_allclose(float(loss_new), float(loss_old), rtol=1e-6)
    flat_old = jax.tree_util.tree_leaves_with_path(grads_old)
    for (path, g_old), g_new in zip(flat_old, jax.tree.leaves(grads_new), strict=True):
        g_old = np.asarray(g_old)
        scale = float(np.max(np.abs(g_old))) + 1e-12
        np.testing.assert_allclose(np.asarray(g_new) / scale, g_old / scale, atol=2e-5,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("groups", [None, 2, 5], ids=["default", "3+2", "1each"])
@pytest.mark.parametrize("family", ["attnres_full", "attnres_block", "moda"])
def test_grouped_stack_gives_nn_scans_loss_and_gradients(family, groups, monkeypatch):
    """The depth-linear stack against nn.scan's (``layer_scan = "carries"``) for
    every family with depth banks: 5 blocks in the default grouping (one group
    at this depth), in uneven groups (3 + 2), or one group each (every block
    reads the tightest cut, ``bank_extent`` of its own end), with a skipped and
    a permuted block: the cut reads see every slot they need."""
    if groups is None:
        assert len(depth_scan.position_groups(GROUPED.depth)) == 1
    else:
        monkeypatch.setattr(depth_scan, "GROUPS", groups)
        monkeypatch.setattr(depth_scan, "MIN_SPAN", 1)
    tokens, params, reference = _grouped_reference(family)
    _assert_same_loss_and_gradients(
        _grouped_loss_and_grads(family, "depth_linear", tokens, params), reference)
    # Something flowed into the family's own parameters.
    assert any(np.abs(np.asarray(g)).max() > 0
               for path, g in jax.tree_util.tree_leaves_with_path(reference[1])
               if "residual" in jax.tree_util.keystr(path))


@pytest.mark.parametrize("groups,chunk", [(2, 2), (5, 1)], ids=["3+2", "1each"])
def test_moda_in_chunks_gives_nn_scans_loss_and_gradients(groups, chunk, monkeypatch):
    """moda's caches in chunks (``moda.CHUNK`` slots or more, ending where
    position groups end), which the depth-linear stack gives each group only
    up to its end, and which the plain scan carries whole: both give the loss
    and gradients of nn.scan on unchunked caches (a skipped and a permuted
    block; one softmax over the chunks' keys)."""
    tokens, params, reference = _grouped_reference("moda")  # whole caches
    monkeypatch.setattr(depth_scan, "GROUPS", groups)
    monkeypatch.setattr(depth_scan, "MIN_SPAN", 1)
    monkeypatch.setattr(moda, "CHUNK", chunk)
    assert len(family_of(_grouped_spec("moda", "depth_linear")).chunks) > 1
    for layer_scan in ("depth_linear", "carries"):
        _assert_same_loss_and_gradients(
            _grouped_loss_and_grads("moda", layer_scan, tokens, params), reference)


def _plain_depth_mix(bank, valid, q, w, eps):
    """The spec's formula, differentiated by autodiff."""
    v = bank.astype(jnp.float32)
    logits = jnp.einsum("mbtd,d->mbt", v, q * w) * jax.lax.rsqrt(
        jnp.mean(v * v, axis=-1) + eps)
    p = jax.nn.softmax(jnp.where(valid[:, None, None], logits, -jnp.inf), axis=0)
    return jnp.einsum("mbt,mbtd->btd", p, v).astype(bank.dtype)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-5), (jnp.bfloat16, 2e-2)])
def test_depth_mix_vjp_equals_autodiff_of_the_formula(dtype, tol):
    rng = np.random.default_rng(4)
    bank = normal(rng, (6, 2, 5, 16), 3, dtype)
    valid = np.array([True, True, False, True, False, False])
    q, w = normal(rng, (16,)), 1 + normal(rng, (16,), 0.2)
    ct = normal(rng, (2, 5, 16))

    def grads(mix):
        def f(b, q, w):
            return jnp.sum(mix(b, valid, q, w, 1e-6).astype(jnp.float32) * ct)
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(bank, q, w)

    (v_new, g_new), (v_old, g_old) = grads(depth_mix.depth_mix), grads(_plain_depth_mix)
    np.testing.assert_allclose(float(v_new), float(v_old), rtol=tol)
    for a, b in zip(g_new, g_old, strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a / np.abs(b).max(), b / np.abs(b).max(), atol=tol)
    assert not np.any(np.asarray(g_new[0], np.float32)[~np.asarray(valid)])  # masked: no grad


def test_depth_mixes_vjp_equals_autodiff_of_the_formula():
    """Two mixes over different slots with their log-sum-exps, the inverse RMS
    given per slot (its cotangent returned, not pushed into the bank): values
    and gradients of every input equal autodiff of the spec's formula."""
    rng = np.random.default_rng(5)
    bank = normal(rng, (2, 5, 6, 16), 3)  # [B, T, M, d]
    inv_rms = jax.jit(depth_mix.slot_inv_rms, static_argnums=1)(bank, 1e-6)
    valid_mk = np.array([[1, 1], [1, 1], [0, 1], [1, 0], [1, 1], [0, 0]], bool)
    q, w = normal(rng, (2, 16)), 1 + normal(rng, (2, 16), 0.2)
    ct_h, ct_lse = normal(rng, (2, 5, 2, 16)), normal(rng, (2, 5, 2))

    def plain(bank, r, valid_mk, q, w):
        logits = jnp.einsum("btmd,kd->btmk", bank, q * w) * r[..., None]
        logits = jnp.where(valid_mk, logits, -jnp.inf)
        p = jax.nn.softmax(logits, axis=2)
        return jnp.einsum("btmk,btmd->btkd", p, bank), jax.nn.logsumexp(logits, axis=2)

    def loss(mixes):
        def f(bank, r, q, w):
            h, lse = mixes(bank, r, valid_mk, q, w)
            return jnp.sum(h * ct_h) + jnp.sum(lse * ct_lse)
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))(bank, inv_rms, q, w)

    (v_new, g_new), (v_old, g_old) = loss(depth_mix.depth_mixes), loss(plain)
    np.testing.assert_allclose(float(v_new), float(v_old), rtol=1e-5)
    for a, b in zip(g_new, g_old, strict=True):
        np.testing.assert_allclose(a / np.abs(b).max(), b / np.abs(b).max(), atol=2e-5)
    assert not np.any(np.asarray(g_new[0])[:, :, 5]) and not np.any(np.asarray(g_new[1])[:, :, 5])


def test_partial_mix_merged_with_the_next_source_equals_the_mix_over_all():
    """attnres's two-phase block: a mix over slots ``0 .. 3`` merged with slot 4
    is the mix over ``0 .. 4`` (forward and gradients)."""
    rng = np.random.default_rng(6)
    bank = normal(rng, (5, 2, 3, 8), 2)  # [M, B, T, d], as depth_mix takes it
    q, w = normal(rng, (8,)), 1 + normal(rng, (8,), 0.2)
    ct = normal(rng, (2, 3, 8))
    upto = np.arange(5) <= 3

    def two_phase(bank, q, w):
        bank_btmd = jnp.moveaxis(bank, 0, 2)
        h, lse = depth_mix.depth_mixes(bank_btmd, depth_mix.slot_inv_rms(bank_btmd, 1e-6),
                                       upto[:, None], q[None], w[None])
        return jnp.sum(ct * merge_partial(h[:, :, 0], lse[:, :, 0], bank[4], q, w, 1e-6))

    def direct(bank, q, w):
        return jnp.sum(ct * depth_mix.depth_mix(bank, jnp.ones(5, bool), q, w, 1e-6))

    (v2, g2), (v1, g1) = (jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(bank, q, w)
                          for f in (two_phase, direct))
    np.testing.assert_allclose(float(v2), float(v1), rtol=1e-5)
    for a, b in zip(g2, g1, strict=True):
        np.testing.assert_allclose(a / np.abs(b).max(), b / np.abs(b).max(), atol=2e-5)


def _concat_attention_with_depth(q, k, v, qd, groups):
    """One softmax over the concatenated sequence and depth logits, every key
    head repeated to its query heads (the form the grouped one replaced)."""
    b, t, n, h = q.shape
    rep = lambda x, axis: jnp.repeat(x, n // x.shape[axis], axis=axis)  # noqa: E731
    seq = jnp.einsum("btnh,bsnh->bnts", q, rep(k, 2)) / jnp.sqrt(h)
    parts = [jnp.where(jnp.tril(jnp.ones((t, t), bool)), seq, -jnp.inf)]
    for kd, _, valid in groups:
        logits = jnp.einsum("btnh,btnmh->bntm", qd, rep(kd, 2)) / jnp.sqrt(h)
        parts.append(jnp.where(valid, logits, -jnp.inf))
    probs = jax.nn.softmax(jnp.concatenate(parts, axis=-1), axis=-1)
    out, start = jnp.einsum("bnts,bsnh->btnh", probs[..., :t], rep(v, 2)), t
    for _, vd, _ in groups:
        m = vd.shape[3]
        out = out + jnp.einsum("bntm,btnmh->btnh", probs[..., start:start + m], rep(vd, 2))
        start += m
    return out


@pytest.mark.parametrize(
    ("t", "block", "valid"),
    [(5, 128, (True, False, True)),  # one query block (T 5 < 128 rows)
     (6, 2, (True, False, True)),  # three causal blocks merged with the depth part
     (6, 3, (False, False, False))],  # no valid depth key: the sequence part alone
)
def test_grouped_depth_attention_equals_the_concatenated_softmax(monkeypatch, t, block, valid):
    monkeypatch.setattr(layers, "CAUSAL_BLOCK", block)
    rng = np.random.default_rng(5)
    b, n, h, m = 2, 4, 8, 3
    q, qd = normal(rng, (b, t, n, h)), normal(rng, (b, t, n, h))
    seq_k, seq_v = normal(rng, (b, t, 2, h)), normal(rng, (b, t, 2, h))
    ka, va = normal(rng, (b, t, 4, m, h)), normal(rng, (b, t, 4, m, h))
    kf, vf = normal(rng, (b, t, 1, m, h)), normal(rng, (b, t, 1, m, h))
    valid = np.array(valid)

    def run(fn):
        def f(*a):
            groups = ((a[4], a[5], valid), (a[6], a[7], valid))
            return jnp.sum(jnp.sin(fn(a[0], a[2], a[3], a[1], groups)))
        return jax.jit(jax.value_and_grad(f, argnums=tuple(range(8))))(
            q, qd, seq_k, seq_v, ka, va, kf, vf)

    (v_new, g_new), (v_old, g_old) = run(attention_with_depth), run(
        _concat_attention_with_depth)
    np.testing.assert_allclose(float(v_new), float(v_old), rtol=1e-5)
    for a, b_ in zip(g_new, g_old, strict=True):
        np.testing.assert_allclose(a, b_, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("j", "ok"), [(1, True), (1, False), (3, True)])  # 3: past the end
def test_moda_put_slot_equals_a_masked_select(j, ok):
    """moda's cache write (a scatter with a dropped index where not written),
    value and the written keys' gradient, against a select over the slot axis;
    the cache's gradient is the incoming cotangent passed on as is (a fresh
    slot's old value has no gradient: the select would zero it there)."""
    from depthbench.model.residual.moda import put_slot

    rng = np.random.default_rng(3)
    cache, new = normal(rng, (2, 5, 2, 3, 4)), normal(rng, (2, 5, 2, 4))
    weight = normal(rng, (2, 5, 2, 3, 4))
    j, ok = np.int32(j), np.bool_(ok)

    def written(cache, j, ok):  # [slots, 1]: the slot put_slot writes, if any
        return (ok & (j < cache.shape[3]) & (jnp.arange(cache.shape[3]) == j))[:, None]

    def select(cache, new, j, ok):
        return jnp.where(written(cache, j, ok), new[:, :, :, None], cache)

    def run(fn):
        return jax.jit(jax.value_and_grad(lambda c, n: jnp.sum(jnp.sin(fn(c, n, j, ok)) * weight),
                                          argnums=(0, 1)))(cache, new)

    (v_new, (g_cache, g_new)), (v_ref, (g_cache_ref, g_new_ref)) = run(put_slot), run(select)
    np.testing.assert_allclose(float(v_new), float(v_ref), rtol=1e-6)
    np.testing.assert_allclose(g_new, g_new_ref, rtol=1e-6, atol=1e-7)
    incoming = jnp.cos(select(cache, new, j, ok)) * weight
    np.testing.assert_allclose(g_cache, incoming, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(jnp.where(written(cache, j, ok), 0, g_cache), g_cache_ref,
                               rtol=1e-6, atol=1e-7)
