"""Known answers of the depth analyses on tiny models (docs/spec/analysis.md)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from analysis_tiny import tiny_config, tokens
from noisy_params import perturbed

from depthbench.analysis.analyze import analyze
from depthbench.model.blockwise import Blockwise
from depthbench.model.residual.attnres import depth_weights
from depthbench.model.transformer import family_of, permute_blocks
from depthbench.run import init_run

X = tokens(4, 16)


def _perturbed(run, scale=0.1, seed=1):
    return perturbed(run.params, seed, scale)


def _zero_outputs(params, blocks):
    """Blocks whose attention and MLP write nothing: identities for pre_ln."""
    params = jax.tree.map(lambda a: a, params)
    for name, leaf in (("attn", "o"), ("mlp", "down")):
        zeroed = np.array(params["blocks"][name][leaf])  # a copy, set in numpy: no program
        zeroed[blocks] = 0.0
        params["blocks"][name][leaf] = jax.device_put(zeroed)
    return params


@pytest.fixture(scope="module")
def pre_ln():
    run = init_run(tiny_config("pre_ln", 3))
    return run.with_params(_perturbed(run))


def test_identity_blocks_have_zero_distance_and_zero_causal_score(pre_ln):
    run = pre_ln.with_params(_zero_outputs(pre_ln.params, slice(None)))
    r = analyze(run, X, ["angular_distance", "causal_score", "layer_pruning"], progress=False)
    ang = np.array([[np.nan if v is None else v for v in row]
                    for row in r["angular_distance"]["matrix"]])
    assert np.nanmax(ang) < 1e-3  # arccos near 1 is ill-conditioned in fp32
    assert all(v == 0.0 for row in r["causal_score"]["matrix"] for v in row if v is not None)
    assert r["layer_pruning"]["delta"] == pytest.approx([0.0] * 3, abs=1e-5)


def test_zeroed_last_block_costs_nothing_to_prune(pre_ln):
    run = pre_ln.with_params(_zero_outputs(pre_ln.params, 2))
    r = analyze(run, X, ["effective_depth"], progress=False)
    delta = r["layer_pruning"]["delta"]
    assert delta[2] == pytest.approx(0.0, abs=1e-5)
    assert min(abs(delta[0]), abs(delta[1])) > 1e-4
    assert r["effective_depth"]["needed"][2] is False


@pytest.mark.parametrize("family", ["pre_ln", "attnres_full"])
def test_swapping_identical_blocks_scores_zero(family):
    run = init_run(tiny_config(family, 3))
    params = _perturbed(run)
    params["blocks"] = jax.tree.map(
        lambda a: jax.device_put(np.broadcast_to(np.asarray(a)[:1], a.shape)), params["blocks"])
    if "query" in params.get("residual", {}):
        # attnres: the readout's pair is the right boundary of the last block
        # and moves in a swap, so it must equal the blocks' attention-side pair.
        for name in ("query", "key_norm"):
            params["residual"][name] = params["blocks"]["residual"][name][0, 0]
    run = run.with_params(params)
    r = analyze(run, X, ["permutation_score"], progress=False)
    values = [v for row in r["permutation_score"]["matrix"] for v in row if v is not None]
    assert len(values) == 3 and max(values) < 1e-6


@pytest.mark.parametrize("family,options", [
    ("hc", {"lens_rule": "readout"}),  # hc's norm_then_sum: the lens decodes by the readout
    ("mhc", {}),  # mean_then_norm: the original's reduce-then-norm lens is the readout
    ("attnres_block", {}),
])
def test_logit_lens_at_the_last_depth_is_the_model_output(family, options):
    run = init_run(tiny_config(family, 2), options=options)
    run = run.with_params(_perturbed(run, 0.3))
    r = analyze(run, X, ["logit_lens"], progress=False)
    lens = r["logit_lens"]
    assert lens["kl_to_final"][-1] == pytest.approx(0.0, abs=1e-5)
    assert lens["top5_overlap"][-1] == pytest.approx(1.0)
    assert lens["early_exit_ce"][-1] == pytest.approx(lens["final_loss"], rel=1e-5)
    assert lens["kl_to_final"][0] > 1e-3 and len(lens["kl_to_final"]) == 3


def test_attnres_depth_weights_at_init_are_uniform_over_visible_sources():
    # Block size 2 (sublayers): sublayer c sees slots 0 .. ceil(c / 2), all
    # queries are 0 at init, so each visible slot gets 1 / (1 + ceil(c / 2)).
    run = init_run(tiny_config("attnres_block", 3, **{"model.residual.attnres_block_size": 2}))
    r = analyze(run, X, ["depth_weights"], progress=False)
    w = np.array(r["depth_weights"]["weights"])
    want = np.zeros((6, 4))
    for c in range(6):
        k = 1 + -(-c // 2)
        want[c, :k] = 1.0 / k
    np.testing.assert_allclose(w, want, atol=1e-6)
    assert r["depth_weights"]["dead_segment"] == 0  # block 0's MLP mix: 1/2 on x0


def test_attnres_depth_weights_by_hand():
    """softmax_m(q.(w*v_m)/rms(v_m)) over the valid slots, computed by hand."""
    rng = np.random.default_rng(0)
    bank = rng.normal(size=(3, 1, 2, 4)).astype(np.float32)
    q, w = rng.normal(size=4).astype(np.float32), rng.normal(size=4).astype(np.float32)
    valid = np.array([True, True, False])
    got = np.asarray(depth_weights(jnp.asarray(bank), jnp.asarray(valid), q, w, 1e-6))
    logits = np.einsum("mbtd,d->mbt", bank, q * w) / np.sqrt(np.mean(bank**2, -1) + 1e-6)
    e = np.exp(logits[:2] - logits[:2].max(0))
    np.testing.assert_allclose(got[:2], e / e.sum(0), rtol=1e-5)
    assert np.all(got[2] == 0)


def test_attnres_skip_follows_the_next_output_rule():
    config = tiny_config("attnres_full", 3)
    run = init_run(config)
    run = run.with_params(_perturbed(run, 0.5))
    skip = [True, False, True]
    z = run.states(X[:2], active=skip)
    with run.context():
        states = jax.jit(Blockwise(run).entry_states)(run.params, jnp.asarray(X[:2]))
    # Block 1's entry: slots x0, y_attn0, y_mlp0 (the bank's slot axis after the block axis).
    bank_lmbtd = np.moveaxis(np.asarray(states["bank"]), 1 + family_of(run.spec).slot_axis, 1)
    newest = bank_lmbtd[1, 2]
    # The model's grouped stack mixes over a cut bank, Blockwise over the whole
    # one: the same sums in another order (values up to ~20, fp32).
    np.testing.assert_allclose(z[2], newest, rtol=1e-5, atol=1e-4)
    removed = init_run(config, options={"skip_rule": "remove"}).with_params(run.params)
    assert np.abs(removed.states(X[:2], active=skip)[2] - newest).max() > 1e-3


def test_attnres_swap_moves_the_right_boundary_mix():
    fam = family_of(init_run(tiny_config("attnres_full", 3)).spec)
    q = jnp.arange(3 * 2 * 1, dtype=jnp.float32).reshape(3, 2, 1)  # query[block, sub]
    params = {"blocks": {"residual": {"query": q, "key_norm": q + 100}},
              "residual": {"query": jnp.array([9.0]), "key_norm": jnp.array([109.0])}}
    out = permute_blocks(fam, params, jnp.array([2, 1, 0]))  # swap blocks 0 and 2
    # Attention-side pairs (sub 0) by position: 0 stays block 2's own (one
    # source, unused); position 1 produces position 0's right boundary, which
    # is now block 2's: the readout's pair; the readout gets block 0's right
    # boundary pair (block 1's attention side, 2.0).
    assert out["blocks"]["residual"]["query"][:, 0, 0].tolist() == [4.0, 9.0, 4.0]
    assert out["residual"]["query"].tolist() == [2.0]
    assert out["blocks"]["residual"]["query"][:, 1, 0].tolist() == [5.0, 3.0, 1.0]
    plain = init_run(tiny_config("attnres_full", 3), options={"swap_rule": "block"})
    kept = permute_blocks(plain.family, params, jnp.array([2, 1, 0]))
    assert kept["residual"]["query"].tolist() == [9.0]
