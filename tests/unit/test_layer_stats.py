"""The backward layer statistics are those of jax.grad of the loss on each depth state.

For each block ``l`` the test writes the rest of the model as a function of
block ``l``'s output depth state (the backbone's ``Block`` applied block by
block from that state, the readout, the LM head, the cross entropy) and takes
``jax.grad`` of it directly, one block at a time; the trainer's probe
(train/layer_stats.py: one backward pass with a straight-through zero at every
boundary) must give the original's four statistics of those gradients, and
of the states the model itself captures (``capture=("z",)``).  Families: a
state of one vector (pre_ln) and a dict with depth banks the model runs by
its depth-linear scan (moda; the streams of hc/mhc are one vector reshaped);
attnres, whose depth state is a mix its blocks do not pass on, reports NaN
rather than another model's gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from analysis_tiny import tiny_config, tokens
from noisy_params import perturbed

from depthbench import parallel
from depthbench.model.layers import RMSNorm
from depthbench.model.residual.protocol.capabilities import probes
from depthbench.model.transformer import Block, cross_entropy
from depthbench.train import layer_stats
from depthbench.train import state as state_lib

DEPTH = 2


def _setup(family: str):
    config = tiny_config(family, DEPTH, **{"model.compute_dtype": "float32"})
    s = state_lib.setup(config, parallel.mesh_from_config(config))
    params = perturbed(jax.device_get(state_lib.init_state(s, 0).params), 3, scale=0.2)
    ids = tokens(2, 12, vocab=64, seed=5)
    return s, params, {"inputs": ids[:, :-1], "targets": ids[:, 1:]}


def _direct_grads(s, params, batch) -> tuple[list, list]:
    """Each block's output depth state and ``jax.grad`` of the loss on it, the rest
    of the model written out from that state."""
    fam, spec = s.family, s.spec
    pr, block, norm = probes(fam), Block(spec, fam), RMSNorm(spec)
    g = params.get("residual", {})
    positions = jnp.arange(batch["inputs"].shape[1], dtype=jnp.int32)

    def run(k, state):
        xs = {"pos": jnp.int32(k), "ident": jnp.int32(k), "active": jnp.ones((), bool)}
        p = jax.tree.map(lambda a: a[k], params["blocks"])
        return block.apply({"params": p}, state, xs, g, positions)[0]

    def loss(state):
        x = fam.readout(g, state, lambda h, eps=None: norm.apply(
            {"params": params["final_norm"]}, h, eps))
        logits = jnp.einsum("btd,dv->btv", x, params["head"])
        return cross_entropy(logits, batch["targets"])

    def consumer(k):  # the family parameters that read block k's output (None: the readout)
        return None if k == spec.depth - 1 else jax.tree.map(
            lambda a: a[k + 1], params["blocks"].get("residual", {}))

    @jax.jit
    def all_blocks():
        state = fam.init_state(g, jnp.take(params["embed"], batch["inputs"], axis=0))
        outputs, zs, grads = [], [], []
        for k in range(spec.depth):
            state = run(k, state)
            outputs.append(state)
        for k in range(spec.depth):
            def rest(z, k=k):
                st = pr.with_boundary_state(outputs[k], z)
                for j in range(k + 1, spec.depth):
                    st = run(j, st)
                return loss(st)

            zs.append(pr.boundary_state(consumer(k), g, outputs[k]))
            grads.append(jax.grad(rest)(zs[-1]))
        return zs, grads

    zs, grads = all_blocks()
    return [np.asarray(z, np.float64) for z in zs], [np.asarray(d, np.float64) for d in grads]


def _moments(xs) -> dict[str, np.ndarray]:
    flat = [x.ravel() for x in xs]
    return {"mean": np.array([f.mean() for f in flat]),
            "variance": np.array([f.var() for f in flat]),
            "magnitude": np.array([np.abs(f).mean() for f in flat]),
            "norm": np.array([np.sqrt(np.sum(f * f)) for f in flat])}


@pytest.mark.parametrize("family", ["pre_ln", "moda"])
def test_backward_statistics_are_those_of_jax_grad_on_each_depth_state(family):
    s, params, batch = _setup(family)
    with s.context():
        stats = jax.device_get(layer_stats.make_layer_stats(s)(params, batch))
        zs, grads = _direct_grads(s, params, batch)
        _, captured = jax.jit(lambda p, x: s.model.apply({"params": p}, x, capture=("z",)))(
            params, batch["inputs"])
    z_model = np.asarray(captured["z"][1:], np.float64)  # the model's own forward
    assert np.max(np.abs(z_model - np.stack(zs))) <= 1e-5 * np.max(np.abs(z_model))
    for direction, xs in (("forward", zs), ("backward", grads)):
        for name, want in _moments(xs).items():
            got = stats[f"{direction}_{name}"]
            assert got.shape == (DEPTH,)
            # the mean's scale is the magnitude's: it sits near 0 where the rest do not
            scale = _moments(xs)["magnitude"] if name == "mean" else np.abs(want)
            assert np.all(np.abs(got - want) <= 1e-4 * scale), (direction, name, got, want)
    assert np.all(stats["backward_norm"] > 0)


def test_a_depth_state_its_blocks_do_not_pass_on_has_no_backward_statistics():
    s, params, batch = _setup("attnres_full")
    with s.context():
        stats = jax.device_get(layer_stats.make_layer_stats(s)(params, batch))
    assert np.all(np.isfinite(stats["forward_norm"])) and np.all(stats["forward_norm"] > 0)
    assert np.all(np.isnan(stats["backward_norm"])) and np.all(np.isnan(stats["backward_mean"]))
