"""XLA CPU compile time with and without the fusion emitters, side by side.

    python -m bench.compile_emitters                     # 4 families, 3 rounds
    python -m bench.compile_emitters --families pre_ln hc --rounds 1

The test suite compiles hundreds of tiny programs and runs each for
milliseconds, so its time is XLA's compile time (tests/helpers/fast_xla.py).  This
compiles a tiny model's init and AdamW train step per family (d 32, 3 blocks,
8 tokens; the shape of tests/unit/test_families_shared.py) at backend
optimisation level 0, once with XLA's default CPU emitters and once with
``--xla_cpu_use_fusion_emitters=false``.  XLA reads its flags when the backend
starts, so each measurement is a fresh process; the two settings alternate
(A, B, A, B ...) so load changes hit both, and the table gives each setting's
median and their ratio.  Each process also prints the first step's loss: the
two settings must agree on it exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench import common

BASE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
SETTINGS = {"fusion emitters (default)": BASE,
            "classic emitters": f"{BASE} --xla_cpu_use_fusion_emitters=false"}


def measure(families: list[str]) -> dict:
    """In this process (XLA_FLAGS already set): per family, the seconds spent in
    XLA's compile of init and train step, and the first step's loss."""
    import time

    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn

    from depthbench.model.spec import ModelSpec
    from depthbench.model.transformer import Transformer, cross_entropy
    from depthbench.shapes import Shape, rule_d_ff

    shape = Shape(depth=3, d_model=32, d_ff=rule_d_ff(32), n_heads=4, n_kv_heads=4,
                  vocab_size=64)
    tokens = jnp.asarray([[(7 * i + j) % 64 for j in range(9)] for i in range(2)], jnp.int32)
    jax.jit(lambda x: x + 1)(tokens).block_until_ready()  # the backend's start-up, not timed
    out = {}
    for family in families:
        model, opt = Transformer(ModelSpec.from_shape(shape, family=family)), optax.adamw(1e-2)

        def step(p, s, model=model, opt=opt):
            def loss_fn(p):
                return cross_entropy(model.apply({"params": p}, tokens[:, :-1])[0], tokens[:, 1:])

            loss, grads = jax.value_and_grad(loss_fn)(p)
            updates, s = opt.update(grads, s, p)
            return optax.apply_updates(p, updates), s, loss

        lowered = jax.jit(model.init).lower(jax.random.key(0), tokens[:, :-1])
        start = time.perf_counter()
        init = lowered.compile()
        seconds = time.perf_counter() - start
        params = nn.unbox(init(jax.random.key(0), tokens[:, :-1])["params"])
        lowered = jax.jit(step).lower(params, opt.init(params))
        start = time.perf_counter()
        compiled = lowered.compile()
        seconds += time.perf_counter() - start
        out[family] = {"seconds": seconds, "loss": float(compiled(params, opt.init(params))[2])}
    return out


def run_one(flags: str, families: list[str]) -> dict:
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "bench.compile_emitters", "--child",
                           "--families", *families], capture_output=True, text=True,
                          env=env, cwd=common.ROOT, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["pre_ln", "hc", "mhc", "attnres_full"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.families)))
        return
    print(common.header("XLA CPU compile time: fusion emitters vs classic emitters"))
    results = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name, flags in SETTINGS.items():
            results[name].append(run_one(flags, args.families))
    default, classic = (results[name] for name in SETTINGS)
    rows = []
    for family in args.families:
        a = statistics.median(r[family]["seconds"] for r in default)
        b = statistics.median(r[family]["seconds"] for r in classic)
        same = {r[family]["loss"] for r in default + classic}
        rows.append({"family": family, "default s": f"{a:.2f}", "classic s": f"{b:.2f}",
                     "classic / default": f"{b / a:.2f}",
                     "first-step loss": "equal" if len(same) == 1 else f"DIFFER {sorted(same)}"})
    a, b = (statistics.median(sum(r[f]["seconds"] for f in args.families) for r in runs)
            for runs in (default, classic))
    rows.append({"family": "all", "default s": f"{a:.2f}", "classic s": f"{b:.2f}",
                 "classic / default": f"{b / a:.2f}", "first-step loss": ""})
    print(f"init + AdamW train step compiled per family; medians of {args.rounds} "
          "alternating rounds")
    print(common.table(rows))


if __name__ == "__main__":
    main()
