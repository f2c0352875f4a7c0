"""What the per-block statistics cost a quickstart run at the default interval.

    python -m bench.layer_stats                          # quickstart's families x depths
    python -m bench.layer_stats --families pre_ln --depths 10 --reps 3

Per (family, depth) of the quickstart spec (micro suite, batch 8 x 128, 150
steps), in one process: the trainer's own train step and layer-statistics
probe (``train/layer_stats.py``: the depth states' RMS from the model's
forward, and the original's four statistics of each block's output and of
the loss's gradient on it from one block-by-block backward pass), and the
forward-only probe it replaces (``residual_stats``).  Compile seconds of each
probe, then the median of ``--reps`` interleaved calls (A, B, C, A, B, C ...)
of the train step, the forward-only probe and the full probe.  The cost of a
run at the default ``train.layer_stats_every`` (100, base.py; quickstart
itself sets 0) is: the probe's compile once plus one call per logged step
(``due``: steps 100 and 150 of 150), against the run's 150 train steps.
"""

from __future__ import annotations

import argparse
import time

from bench import common

FAMILIES = ("pre_ln", "hc", "mhc", "attnres_full")
DEPTHS = (2, 4, 10)
EVERY = 100  # base.py's train.layer_stats_every


def _config(family: str, depth: int):
    from depthbench import config as config_lib

    return config_lib.load("quickstart", [f"--config.model.family={family}",
                                          f"--config.model.depth={depth}"])


def measure(family: str, depth: int, reps: int) -> dict:
    import jax
    import numpy as np

    from depthbench.train import layer_stats

    config = _config(family, depth)
    step = common.DepthbenchStep(config)
    s = step.setup
    def forward_only(p, b):  # what the probe was before the backward statistics
        _, out = s.model.apply({"params": p}, b["inputs"], capture=("z",))
        return layer_stats.residual_stats(out["z"])

    forward = jax.jit(forward_only)
    full = jax.jit(lambda p, b: layer_stats.layer_stats(s, p, b))
    compile_s = {}
    for name, fn in (("forward", forward), ("full", full)):
        t0 = time.perf_counter()
        with s.context():
            compiled = fn.lower(step.state.params, step.batch).compile()
        compile_s[name] = time.perf_counter() - t0
        if name == "forward":
            fwd_c = compiled
        else:
            full_c = compiled
    step.compile()
    step()  # warm

    def probe(c):
        return lambda: jax.block_until_ready(c(step.state.params, step.batch))

    times = common.interleaved({"step": step, "forward": probe(fwd_c), "full": probe(full_c)},
                               reps, warm=True)
    steps = int(config.train.steps)
    calls = sum(1 for k in range(1, steps + 1) if k % EVERY == 0 or k == steps)
    train = steps * times["step"]
    cost = {k: compile_s[k] + calls * times[k] for k in ("forward", "full")}
    stats = jax.device_get(full_c(step.state.params, step.batch))
    assert np.all(np.isfinite(stats["forward_norm"]))
    return {"family": family, "L": depth, "step ms": 1e3 * times["step"],
            "fwd probe ms": 1e3 * times["forward"], "full probe ms": 1e3 * times["full"],
            "fwd compile s": compile_s["forward"], "full compile s": compile_s["full"],
            "run train s": train,
            "fwd-only cost %": 100 * cost["forward"] / train,
            "full cost %": 100 * cost["full"] / train,
            "added by backward %": 100 * (cost["full"] - cost["forward"]) / train}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--depths", nargs="+", type=int, default=list(DEPTHS))
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    print(common.header("layer statistics on the quickstart, train.layer_stats_every = 100"))
    rows = [measure(f, d, args.reps) for f in args.families for d in args.depths]
    print(common.table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
