"""Is the input pipeline ever what a training step waits for?

Measures, in one run on the machine at hand:

1. the grain pipeline alone: host batches per second drawn from
   ``data.train_iterator`` (the micro config: 16 x 128 tokens);
2. the training step alone: steps per second of the trainer's jitted step
   (``depthbench.train.step.make_train_step``) on the same config, after
   compilation, with the batch already in memory;
3. both together, as the trainer runs them: the share of wall time spent in
   ``next(iterator)`` while stepping.

and prints the ratio (1) / (2): how many times faster the pipeline produces
batches than the step consumes them (goal: >= 20x on the micro config on a
2-core CPU).

    python bench/bench_data.py                               # experiments/micro.py
    python bench/bench_data.py --config experiments/base.py --steps 50 --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def pipeline_rate(config, prepared, batches: int) -> tuple[float, float]:
    """(batches/s, seconds to the first batch) of a fresh training iterator."""
    from depthbench import data

    t0 = time.perf_counter()
    it = data.train_iterator(config, prepared)
    next(it)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches / (time.perf_counter() - t0), first


def _trainer_step(config):
    """The trainer's jitted step and a fresh state (None if the trainer is not importable)."""
    try:
        from depthbench import parallel
        from depthbench.train import state as state_lib
        from depthbench.train import step as step_lib
    except ImportError as e:
        print(f"note: trainer step unavailable ({e}); timing a plain step", file=sys.stderr)
        return None
    s = state_lib.setup(config, parallel.mesh_from_config(config))
    return (
        step_lib.make_train_step(s, int(config.train.microbatches)),
        state_lib.init_state(s, int(config.train.seed)),
        "depthbench.train.step",
    )


def _plain_step(config):
    """value_and_grad + optax.adamw of the Transformer: the same work, without the trainer."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn

    from depthbench.model.spec import ModelSpec
    from depthbench.model.transformer import Transformer, cross_entropy

    model = Transformer(ModelSpec.from_config(config))
    tokens = jnp.zeros((1, config.train.seq_len), jnp.int32)
    params = nn.unbox(model.init(jax.random.key(0), tokens)["params"])
    tx = optax.chain(
        optax.clip_by_global_norm(config.train.clip_norm),
        optax.adamw(
            config.train.lr,
            b1=config.train.b1,
            b2=config.train.b2,
            weight_decay=config.train.weight_decay,
        ),
    )

    @jax.jit
    def step(state, batch):
        params, opt = state

        def loss_fn(p):
            return cross_entropy(model.apply({"params": p}, batch["inputs"])[0], batch["targets"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), {"loss": loss}

    return step, (params, tx.init(params)), "value_and_grad + optax.adamw (plain)"


def step_rate(step, state, batch, steps: int) -> tuple[float, object]:
    import jax

    for _ in range(2):  # compile, then one more to settle
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    return steps / (time.perf_counter() - t0), state


def waiting_share(step, state, it, steps: int) -> float:
    """Share of wall time spent waiting for ``next(it)`` in a training loop."""
    import jax

    waited = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        batch = next(it)
        waited += time.perf_counter() - t
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)  # the trainer reads the loss: the host syncs each step
    return waited / (time.perf_counter() - t0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(ROOT / "experiments" / "micro.py"))
    parser.add_argument("--steps", type=int, default=30, help="timed training steps")
    parser.add_argument("--batches", type=int, default=2000, help="timed pipeline batches")
    parser.add_argument("--json", action="store_true")
    args, overrides = parser.parse_known_args(argv)

    from depthbench import config as config_lib
    from depthbench import data

    config = config_lib.load(args.config, overrides)
    prepared = data.prepare(config, progress=False)

    batches_per_s, first_batch_s = pipeline_rate(config, prepared, args.batches)
    built = _trainer_step(config) or _plain_step(config)
    step, state, which = built
    batch = next(data.train_iterator(config, prepared))
    steps_per_s, state = step_rate(step, state, batch, args.steps)
    share = waiting_share(step, state, data.train_iterator(config, prepared), args.steps)

    result = {
        "config": os.path.relpath(args.config, ROOT),
        "batch": [int(config.train.batch_size), int(config.train.seq_len)],
        "cpu_cores": len(os.sched_getaffinity(0)),
        "pipeline_batches_per_s": round(batches_per_s, 1),
        "pipeline_first_batch_ms": round(first_batch_s * 1e3, 1),
        "train_steps_per_s": round(steps_per_s, 2),
        "step": which,
        "ratio": round(batches_per_s / steps_per_s, 1),
        "waiting_share": round(share, 4),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key.ljust(width)}  {value}")
    verdict = "ok" if result["ratio"] >= 20 else "BELOW GOAL"
    print(
        f"\npipeline is {result['ratio']:.0f}x faster than the step consumes "
        f"(goal >= 20x: {verdict}); {100 * share:.2f}% of a training loop waits for data"
    )
    return 0 if np.isfinite(result["ratio"]) else 1


if __name__ == "__main__":
    sys.exit(main())
