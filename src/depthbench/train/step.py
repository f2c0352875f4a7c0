"""The jitted train step and eval step (the layer-statistics probe: ``layer_stats.py``).

The train step donates the state; micro-batches run under ``lax.scan`` with an
fp32 gradient accumulator (one body for any number of them).  Compute in
``model.compute_dtype`` on fp32 master parameters, every reduction fp32; a
``mask`` scores only the batch's supervised tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec

from depthbench import parallel
from depthbench.model import transformer
from depthbench.train.state import TrainSetup, TrainState

# {"inputs": int32[B, T], "targets": int32[B, T]} (+ "mask": bool[B, T] when fine-tuning)
Batch = dict[str, jax.Array]


def _in_context(s: TrainSetup, fn: Callable) -> Callable:
    """Call ``fn`` with the run's mesh and logical rules active, so that the
    model's logical constraints resolve when it is traced."""

    def call(*args):
        with s.context():
            return fn(*args)

    call.jitted = fn
    return call


def loss_fn(s: TrainSetup, params: Any, batch: Batch, key: jax.Array) -> jax.Array:
    if "segments" in batch:  # packed rows: each document on its own
        logits, _ = s.model.apply({"params": params}, batch["inputs"], rngs={"dropout": key},
                                  segments=batch["segments"], positions=batch["positions"])
    else:
        logits, _ = s.model.apply({"params": params}, batch["inputs"], rngs={"dropout": key})
    if "mask" not in batch:
        return transformer.cross_entropy(logits, batch["targets"])
    return transformer.cross_entropy(logits, batch["targets"], batch["mask"])


def _supervised(mask_bt: jax.Array) -> jax.Array:
    """Supervised tokens, at least 1 (the masked mean's own denominator)."""
    return jnp.maximum(jnp.sum(mask_bt.astype(jnp.float32)), 1.0)


def _split_micro(x_bt: jax.Array, microbatches: int) -> jax.Array:
    """[B, T] -> [M, B/M, T]; micro-batch m takes rows m, M + m, 2M + m, ...

    Interleaving keeps every device's rows on that device (the batch is
    sharded in contiguous blocks), so no micro-batch needs a reshuffle.
    """
    b = x_bt.shape[0]
    x = x_bt.reshape(b // microbatches, microbatches, *x_bt.shape[1:]).swapaxes(0, 1)
    spec = PartitionSpec(None, parallel.BATCH_AXES, *([None] * (x_bt.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, spec)


def grads_and_loss(s: TrainSetup, params: Any, batch: Batch, key: jax.Array,
                   microbatches: int = 1) -> tuple[jax.Array, Any]:
    """Mean loss and its gradient over the whole batch (fp32 accumulation)."""
    grad_fn = jax.value_and_grad(lambda p, b, k: loss_fn(s, p, b, k))
    if microbatches == 1:
        loss, grads = grad_fn(params, batch, key)
        return loss, jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    micro = jax.tree.map(lambda x: _split_micro(x, microbatches), batch)
    if "mask" in batch:
        # Each micro-batch's masked mean times its share of the batch's supervised
        # tokens (x M: the sum below is divided by M), so that the batch's loss is
        # the mean over all of its supervised tokens, not a mean of means.
        total = _supervised(batch["mask"])
        grad_fn = jax.value_and_grad(lambda p, b, k: loss_fn(s, p, b, k) * (
            _supervised(b["mask"]) * microbatches / total))
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    zeros = jax.lax.with_sharding_constraint(zeros, s.param_shardings)  # laid out like params

    def body(carry, xs):
        g_acc, l_acc = carry
        mb, i = xs
        loss, g = grad_fn(params, mb, jax.random.fold_in(key, i))
        g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
        return (g_acc, l_acc + loss), None

    (g_sum, l_sum), _ = jax.lax.scan(
        body, (zeros, jnp.zeros((), jnp.float32)),
        (micro, jnp.arange(microbatches, dtype=jnp.int32)))
    return l_sum / microbatches, jax.tree.map(lambda g: g / microbatches, g_sum)


def global_norm(tree: Any) -> jax.Array:
    """sqrt(sum of squares) over every leaf, in fp32 (what clipping measures)."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def train_step(s: TrainSetup, state: TrainState, batch: Batch,
               microbatches: int = 1) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer update.  Metrics: loss, grad_norm (before clipping) and
    the learning rate this update used."""
    key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    loss, grads = grads_and_loss(s, state.params, batch, key, microbatches)
    grad_norm = global_norm(grads)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    updates, opt_state = s.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new, {"loss": loss, "grad_norm": grad_norm, "lr": s.schedule(state.step)}


def make_train_step(s: TrainSetup, microbatches: int = 1) -> Callable:
    """``(state, batch) -> (state, metrics)``, jitted, sharded, state donated."""
    rep = parallel.replicated(s.mesh)
    fn = jax.jit(
        lambda state, batch: train_step(s, state, batch, microbatches),
        in_shardings=(s.state_shardings, parallel.batch_sharding(s.mesh)),
        out_shardings=(s.state_shardings, rep),
        donate_argnums=0,
    )
    return _in_context(s, fn)


def make_eval_step(s: TrainSetup) -> Callable:
    """``(params, batch) -> mean loss`` (fp32)."""
    fn = jax.jit(
        lambda params, batch: loss_fn(s, params, batch, jax.random.key(0)),
        in_shardings=(s.param_shardings, parallel.batch_sharding(s.mesh)),
        out_shardings=parallel.replicated(s.mesh),
    )
    return _in_context(s, fn)
