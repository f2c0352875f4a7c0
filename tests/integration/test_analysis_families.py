"""Every registered family serves the analysis protocol (no family names in the
analyses): captured depth states, exact logit lens at the last depth (under the
stream families' ``lens_rule = readout``), probes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from analysis_tiny import tiny_config, tokens

from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.capabilities import AnalysisOptions
from depthbench.run import init_run


def _readout_lens(family: str) -> dict:
    """The lens decoded by the model's own readout, where a family has the switch."""
    cls = registry.get(family)
    own = cls.analysis_options if issubclass(cls, AnalysisOptions) else {}
    return {"lens_rule": "readout"} if "lens_rule" in own else {}


@pytest.mark.slow
@pytest.mark.parametrize("family", registry.names())
def test_capture_all(family):
    run = init_run(tiny_config(family, 2), options=_readout_lens(family))
    leaves, tree = jax.tree.flatten(run.params)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    noisy = [a + 0.05 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys, strict=True)]
    run = run.with_params(jax.tree.unflatten(tree, noisy))
    x = tokens(2, 8)
    logits, cap = run.apply(x, capture=("z", "lens_logits", "probe"))
    d = run.spec.d_model
    assert cap["z"].shape[:3] == (3, 2, 8) and cap["z"].shape[3] % d == 0
    np.testing.assert_allclose(cap["lens_logits"][-1], logits, rtol=1e-5, atol=1e-5)
    assert np.abs(cap["lens_logits"][0] - logits).max() > 1e-4
    for leaf in jax.tree.leaves(cap["probe"]):
        assert leaf.shape[:2] == (2, 2) and np.all(np.isfinite(leaf))
    # The backbone's z_L is the state the readout reads, for every family.
    # Two programs (states, every capture): equal up to fp32 rounding of the fusions.
    np.testing.assert_allclose(run.states(x)[-1], cap["z"][-1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("family,readout", [("hc", "sum_then_norm"), ("hc", "norm_then_sum"),
                                            ("mhc", "mean_then_norm")])
def test_stream_lens_reduces_then_normalises_by_default(family, readout):
    """The original's logit lens of hc/mhc: ``lm_head(N_out(reduce_s H[s]))`` with
    the model's stream reduction (the sum; the mean under mean_then_norm), at
    every depth; after the last block it is the model's output only when the
    readout itself reduces first (hc's sum_then_norm, mhc's mean_then_norm), not
    under the earlier norm_then_sum."""
    run = init_run(tiny_config(family, 2, **{"model.residual.readout": readout}))
    assert run.config.model.residual.readout == readout
    leaves, tree = jax.tree.flatten(run.params)
    keys = jax.random.split(jax.random.key(5), len(leaves))
    run = run.with_params(jax.tree.unflatten(tree, [
        a + (0.05 * jax.random.normal(k, a.shape)).astype(a.dtype)
        for a, k in zip(leaves, keys, strict=True)]))
    x = tokens(2, 8)
    logits, cap = run.apply(x, capture=("z", "lens_logits", "probe"))
    n, d = run.config.model.residual.hc_n, run.spec.d_model
    streams = np.asarray(cap["z"], np.float64).reshape(*cap["z"].shape[:3], n, d)
    reduced = streams.sum(3) / (n if readout == "mean_then_norm" else 1)
    eps = run.spec.norm_eps
    normed = reduced / np.sqrt(np.mean(reduced**2, -1, keepdims=True) + eps)
    p = run.params
    by_hand = (normed * np.asarray(p["final_norm"]["scale"], np.float64)) @ np.asarray(
        p["head"], np.float64)
    np.testing.assert_allclose(cap["lens_logits"], by_hand, rtol=2e-4, atol=2e-5)
    last_is_output = np.abs(cap["lens_logits"][-1] - logits).max() < 1e-4
    assert last_is_output == (readout != "norm_then_sum")
    assert jnp.all(jnp.isfinite(cap["lens_logits"]))
