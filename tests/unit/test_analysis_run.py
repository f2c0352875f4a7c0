"""load_run: a run directory's checkpoint restored, and the model calls it serves."""

import jax
import numpy as np
import pytest
from analysis_tiny import tiny_config, tokens, write_run

import depthbench
from depthbench.config import ConfigError
from depthbench.model.transformer import Transformer


@pytest.fixture(scope="module")
def run_and_params(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    config = tiny_config("pre_ln", 3)
    params = write_run(run_dir, config)
    return depthbench.load_run(run_dir), params, config


def test_restores_the_latest_parameters(run_and_params):
    run, params, _ = run_and_params
    assert run.step == 7
    got = jax.tree.map(np.asarray, jax.device_get(run.params))
    jax.tree.map(np.testing.assert_array_equal, got, params)


def test_logits_match_the_model(run_and_params):
    run, params, _ = run_and_params
    x = tokens(3, 16)  # 3: not a multiple of anything in particular
    want = np.asarray(jax.jit(Transformer(run.spec).apply)({"params": params}, x)[0])
    got = run.logits(x)
    assert got.dtype == np.float32 and got.shape == (3, 16, 64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_states_and_skip_permute(run_and_params):
    run, params, _ = run_and_params
    x = tokens()
    z = run.states(x)
    assert z.shape == (4, 2, 16, 32)
    embed = params["embed"][x]
    np.testing.assert_allclose(z[0], embed, rtol=1e-6)  # pre_ln: z_0 is the embedding
    # Every block skipped: the model reads the embedding straight out.
    skipped = run.states(x, active=[False] * 3)
    for zl in skipped:
        np.testing.assert_allclose(zl, embed, rtol=1e-6)
    # The identity permutation changes nothing; a swap changes the logits.
    np.testing.assert_array_equal(run.apply(x, ident=[0, 1, 2])[0], run.logits(x))
    assert np.abs(run.apply(x, ident=[1, 0, 2])[0] - run.logits(x)).max() > 1e-3


def test_bad_inputs(run_and_params, tmp_path):
    run = run_and_params[0]
    with pytest.raises(ValueError, match="ident"):
        run.apply(tokens(), ident=[0, 0, 1])
    with pytest.raises(ValueError, match="tokens_bt"):
        run.logits(np.full((1, 4), 64))
    with pytest.raises(ConfigError, match="config.json"):
        depthbench.load_run(tmp_path)
