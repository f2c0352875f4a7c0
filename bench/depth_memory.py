"""Memory and time of the banked families against depth, old layer stack vs new.

attnres_full, attnres_block and moda keep a depth bank (a slot per source) in
their residual state.  Under ``model.layer_scan = "carries"`` (``nn.scan``
saving every block's carry) the backward pass holds ``L`` banks: memory
quadratic in depth.  ``"depth_linear"`` (model/depth_scan.py) keeps one,
and runs the blocks in position groups, each scanning the banks cut to
the slots that can be valid by the group's end.

Prints, in one run, side by side:

1. **CPU curve**: a train step (loss, gradients, SGD update; default remat) at
   d 64, T 256, B 2 for L 8, 16, 32, 64: step time and XLA temp memory
   (``jit(step).lower(...).compile().memory_analysis().temp_size_in_bytes``),
   each relative to pre_ln at the same shape, for both layer stacks;
2. **the trainer's step** (compile only): the same shapes through the
   trainer's own AdamW step (``bench.common.DepthbenchStep``) with
   ``remat_policy=nothing_saveable``, its XLA temp memory relative to pre_ln's
   (the goal at L32: moda <= 3x);
3. **paper scale** (compile only, nothing runs): the paper-400m suite's
   shapes, 4 x 2048 tokens, bf16 compute, temp memory in GiB and relative to
   pre_ln.

Memory numbers do not depend on machine load; step times do (the run prints
``os.getloadavg()`` at its start and end): each family's steps alternate with
pre_ln's and its ratio is the median of the per-pair ratios.  Goals at L32
vs pre_ln: attnres_full <= 2x time and <= 3x memory, attnres_block <= 1.5x /
2x, moda <= 2x / 3x; at 400M L70 attnres_full and moda <= 3x pre_ln's temp
memory.

    python bench/depth_memory.py                       # both tables
    python bench/depth_memory.py --depths 8 16 --paper-depths 16 70 --steps 3
    python bench/depth_memory.py --no-paper --no-old
    python -m bench.depth_memory --depths 32 --no-paper --no-old --steps 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import linen as nn

from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer, cross_entropy
from depthbench.shapes import Shape, suite

BANKED = ("attnres_full", "attnres_block", "moda")
GIB = 2.0**30


def compiled_step(spec: ModelSpec, batch: int, seq: int):
    """The compiled train step (loss, grads, SGD) and its inputs."""
    model = Transformer(spec)
    tokens = jnp.zeros((batch, seq), jnp.int32)
    params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), tokens)["params"]))

    def step(params, tokens_bt):
        def loss(p):
            logits, _ = model.apply({"params": p}, tokens_bt)
            return cross_entropy(logits[:, :-1], tokens_bt[:, 1:])

        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g.astype(p.dtype), params, grads), value

    compiled = jax.jit(step, donate_argnums=0).lower(params, tokens).compile()
    return compiled, params, tokens


def temp_bytes(compiled) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def _runner(compiled, params_shape, tokens):
    """A function running one step of ``compiled`` (after a warm-up step)."""
    state = {"params": jax.tree.map(lambda s: jnp.full(s.shape, 0.01, s.dtype), params_shape)}

    def run():
        state["params"], loss = compiled(state["params"], tokens)
        jax.block_until_ready(loss)

    run()
    return run


def _timed(run) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def time_step(compiled, params_shape, tokens, steps: int) -> float:
    """Median seconds per step over ``steps`` runs after one warm-up."""
    run = _runner(compiled, params_shape, tokens)
    times = [_timed(run) for _ in range(steps)]
    return sorted(times)[len(times) // 2]


def time_ratio(base_run, compiled, params_shape, tokens, steps: int) -> float:
    """Step time relative to ``base_run``'s, the two interleaved (base, family,
    base, ...) so a load change on a shared machine hits both: the median of
    the ``steps`` per-pair ratios."""
    run = _runner(compiled, params_shape, tokens)
    ratios = []
    for _ in range(steps):
        base = _timed(base_run)
        ratios.append(_timed(run) / base)
    return sorted(ratios)[len(ratios) // 2]


def cpu_curve(depths, steps: int, old: bool) -> None:
    """Step time (``steps`` > 0) and temp memory relative to pre_ln; ``steps`` 0:
    memory only (compile only: quick, and exact on a loaded machine)."""
    scans = ("carries", "depth_linear") if old else ("depth_linear",)
    head = "| L | family | " + " | ".join(f"{s} time | {s} temp" for s in scans) + " |"
    print("\n## CPU train step, d 64, T 256, B 2, relative to pre_ln\n")
    print(head)
    print("|" + "---|" * (2 + 2 * len(scans)))
    for depth in depths:
        shape = Shape(depth, 64, 192, 4, 4, 2048)
        base, p, t = compiled_step(ModelSpec.from_shape(shape, "pre_ln"), 2, 256)
        base_mem = temp_bytes(base)
        base_time = time_step(base, p, t, steps) if steps else float("nan")
        base_run = _runner(base, p, t) if steps else None
        print(f"| {depth} | pre_ln | " + " | ".join(
            f"{base_time * 1e3:.0f} ms | {base_mem / 2**20:.1f} MiB".replace("nan", "-")
            for _ in scans) + " |")
        for fam in BANKED:
            cells = []
            for scan in scans:
                spec = ModelSpec.from_shape(shape, family=fam, layer_scan=scan)
                c, p, t = compiled_step(spec, 2, 256)
                rel = time_ratio(base_run, c, p, t, steps) if steps else float("nan")
                cells.append(f"{rel:.2f}x | ".replace("nanx", "-")
                             + f"{temp_bytes(c) / base_mem:.2f}x")
            print(f"| {depth} | {fam} | " + " | ".join(cells) + " |", flush=True)


def trainer_memory(depths) -> None:
    """Temp memory of the trainer's AdamW step (d 64, T 256, B 2, nothing saved),
    relative to pre_ln's: compile only."""
    if __package__ != "bench":  # run as a script: the repository root holds ``bench``
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import common

    print("\n## The trainer's AdamW step, d 64, T 256, B 2, remat nothing_saveable: "
          "XLA temp memory\n")
    print("| L | family | temp (MiB) | x pre_ln |")
    print("|---|---|---|---|")
    for depth in depths:
        base = None
        for fam in ("pre_ln", *BANKED):
            step = common.DepthbenchStep(common.config_at(
                64, depth, 256, 2, 2048, family=fam,
                overrides=["--config.model.remat_policy=nothing_saveable"]), allocate=False)
            step.compile()
            temp = temp_bytes(step.compiled)
            base = base or temp
            print(f"| {depth} | {fam} | {temp / 2**20:.1f} | {temp / base:.2f}x |", flush=True)


def paper_table(depths, old: bool) -> None:
    scans = ("carries", "depth_linear") if old else ("depth_linear",)
    shapes = {s.depth: s for s in suite("paper-400m").shapes()}
    print("\n## paper-400m, compile only: temp memory (GiB, x pre_ln), 4 x 2048 tokens, bf16\n")
    print("| L | pre_ln | " + " | ".join(f"{f} {s}" for f in BANKED for s in scans) + " |")
    print("|" + "---|" * (2 + len(BANKED) * len(scans)))

    def mem(depth, fam, scan):
        spec = ModelSpec.from_shape(shapes[depth], family=fam, compute_dtype="bfloat16",
                                    layer_scan=scan)
        return temp_bytes(compiled_step(spec, 4, 2048)[0])

    for depth in depths:
        base = mem(depth, "pre_ln", "carries")
        cells = [f"{(m := mem(depth, f, s)) / GIB:.1f} ({m / base:.1f}x)"
                 for f in BANKED for s in scans]
        print(f"| {depth} | {base / GIB:.1f} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--paper-depths", type=int, nargs="+", default=[16, 32, 70])
    ap.add_argument("--steps", type=int, default=3,
                    help="timed steps per cell (median); 0: memory only, no timing")
    ap.add_argument("--no-old", action="store_true", help="skip the 'carries' layer stack")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--no-trainer", action="store_true", help="skip the trainer-step memory")
    ap.add_argument("--no-paper", action="store_true")
    a = ap.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if not a.no_cpu:
        cpu_curve(a.depths, a.steps, not a.no_old)
    if not a.no_trainer:
        trainer_memory(a.depths)
    if not a.no_paper:
        paper_table(a.paper_depths, not a.no_old)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
