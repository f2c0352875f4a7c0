"""Per-block statistics of the residual stream, forward and backward (``layer_stats.jsonl``).

What they are and how the gradient on each block's output is taken:
docs/spec/analysis.md, "Per-block statistics during training".  One program
runs the model block by block (:mod:`depthbench.model.blockwise`) with a zero
``eps_l`` injected through the family's probes (``with_boundary_state``), so
nothing here is family-specific."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from depthbench import parallel
from depthbench.model import transformer
from depthbench.model.blockwise import Blockwise
from depthbench.model.residual.protocol.capabilities import probes
from depthbench.train.state import TrainSetup

MOMENTS = ("mean", "variance", "magnitude", "norm")


def moments(x_l: jax.Array) -> dict[str, jax.Array]:
    """The original's four statistics of each ``x_l[l]`` over all its elements (fp32)."""
    x = x_l.reshape(x_l.shape[0], -1).astype(jnp.float32)
    mean = jnp.mean(x, axis=1)
    return {"mean": mean, "variance": jnp.mean(jnp.square(x - mean[:, None]), axis=1),
            "magnitude": jnp.mean(jnp.abs(x), axis=1),
            "norm": jnp.sqrt(jnp.sum(jnp.square(x), axis=1))}


def residual_stats(z_l: jax.Array) -> dict[str, jax.Array]:
    """``state_rms``, ``update_rms``, ``update_ratio`` of the depth states ``z_l``
    ``[L + 1, B, T, D]``."""
    z = z_l.astype(jnp.float32)
    axes = tuple(range(1, z.ndim))
    state_rms = jnp.sqrt(jnp.mean(jnp.square(z), axis=axes))
    update_rms = jnp.sqrt(jnp.mean(jnp.square(z[1:] - z[:-1]), axis=axes))
    return {"state_rms": state_rms, "update_rms": update_rms,
            "update_ratio": update_rms / jnp.maximum(state_rms[:-1], 1e-30)}


def _straight_through(state: Any, moved: Any) -> Any:
    """``state``'s values with ``moved``'s derivative (integer leaves as they are)."""
    def leaf(a, m):
        if not jnp.issubdtype(a.dtype, jnp.inexact):
            return a
        return a + (m - jax.lax.stop_gradient(m)).astype(a.dtype)

    return jax.tree.map(leaf, state, moved)


def _gives_back(state: Any, moved: Any) -> jax.Array:
    """Whether injecting a state's own depth state gives that state back."""
    return jnp.all(jnp.stack([jnp.all(a == m) for a, m in
                              zip(jax.tree.leaves(state), jax.tree.leaves(moved), strict=True)]))


def depth_states_and_grads(s: TrainSetup, params: Any, batch: dict
                           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(z [L + 1, B, T, D], dloss/dz [L, B, T, D], exact)``: the depth states
    ``z_0 .. z_L``, the gradient of the batch's mean loss on each block's output
    ``z_1 .. z_L``, and whether every injection gave the state back (else the
    gradient is of no model)."""
    bw, probe = Blockwise(s), probes(s.family)
    inputs, positions_t = batch["inputs"], jnp.arange(batch["inputs"].shape[1], dtype=jnp.int32)
    segments = batch.get("segments")  # a packed fine-tuning row: its documents apart
    if segments is not None:
        positions_t = batch["positions"]
    depth = s.spec.depth

    def forward(eps_l):
        def body(state, xs):
            pos, eps = xs
            state = bw.run_block(params, state, pos, positions_t, segments)
            z = bw.next_boundary(params, state, pos)
            # the injection as a function of eps alone: its derivative is eps's path only
            held = jax.lax.stop_gradient(state)
            moved = probe.with_boundary_state(held, jax.lax.stop_gradient(z).astype(
                jnp.float32) + eps)
            exact = _gives_back(state, probe.with_boundary_state(state, z))
            return _straight_through(state, moved), (z, exact)

        state, (z_l, exact_l) = jax.lax.scan(body, bw.init_state(params, inputs),
                                             (jnp.arange(depth, dtype=jnp.int32), eps_l))
        # the trained loss: a fine-tuning batch's only where its label mask says
        loss = transformer.cross_entropy(bw.logits(params, state), batch["targets"],
                                         batch.get("mask"))
        return loss, (z_l, jnp.all(exact_l))

    state0 = bw.init_state(params, inputs)
    z0 = probe.boundary_state(bw.family_params(params, 0), params.get("residual", {}),
                              state0)
    grads, (z_l, exact) = jax.grad(forward, has_aux=True)(jnp.zeros((depth, *z0.shape),
                                                                   jnp.float32))
    return jnp.concatenate([z0[None].astype(z_l.dtype), z_l]), grads, exact


def layer_stats(s: TrainSetup, params: Any, batch: dict) -> dict[str, jax.Array]:
    """Every statistic of ``layer_stats.jsonl``, each a vector over depth states
    (``state_rms``) or blocks (the others)."""
    z_l, g_l, exact = depth_states_and_grads(s, params, batch)
    out = residual_stats(z_l)
    for direction, x_l in (("forward", z_l[1:]), ("backward", g_l)):
        for name, values in moments(x_l).items():
            if direction == "backward":
                values = jnp.where(exact, values, jnp.nan)
            out[f"{direction}_{name}"] = values
    return out


def make_layer_stats(s: TrainSetup) -> Callable:
    """``(params, batch) -> {statistic: [value per index]}``, jitted and sharded."""
    fn = jax.jit(lambda params, batch: layer_stats(s, params, batch),
                 in_shardings=(s.param_shardings, parallel.batch_sharding(s.mesh)),
                 out_shardings=parallel.replicated(s.mesh))

    def call(*args):
        with s.context():
            return fn(*args)

    return call
