"""Every registered family serves the analysis protocol (no family names in the
analyses): captured depth states, exact logit lens at the last depth, probes."""

import jax
import numpy as np
import pytest
from analysis_tiny import tiny_config, tokens

from depthbench.analysis import init_run
from depthbench.model.residual import registry


@pytest.mark.slow
@pytest.mark.parametrize("family", registry.names())
def test_capture_all(family):
    run = init_run(tiny_config(family, 2))
    leaves, tree = jax.tree.flatten(run.params)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    noisy = [a + 0.05 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys, strict=True)]
    run = run.with_params(jax.tree.unflatten(tree, noisy))
    x = tokens(2, 8)
    logits, cap = run.apply(x, capture="all")
    d = run.spec.d_model
    assert cap["z"].shape[:3] == (3, 2, 8) and cap["z"].shape[3] % d == 0
    np.testing.assert_allclose(cap["lens_logits"][-1], logits, rtol=1e-5, atol=1e-5)
    assert np.abs(cap["lens_logits"][0] - logits).max() > 1e-4
    for leaf in jax.tree.leaves(cap["probe"]):
        assert leaf.shape[:2] == (2, 2) and np.all(np.isfinite(leaf))
    # The backbone's z_L is the state the readout reads, for every family.
    np.testing.assert_allclose(run.states(x)[-1], cap["z"][-1], rtol=1e-6)
