"""Which XLA:CPU back end should run the dots: train-step CPU time per setting, side by side.

    python -m bench.cpu_dots                      # 3 shapes, every setting, 3 rounds
    python -m bench.cpu_dots --rounds 1 --steps 3 --shapes 128x4

jaxlib 0.10.2 sends a CPU program's dots to YNNPACK by default.  Which library
is faster depends on the CPU: the issue that asked for this measured Eigen's
GEMMs (``--xla_cpu_experimental_ynn_fusion_type=reduce``: reductions stay on
YNNPACK, dots go to Eigen) 10-12% cheaper per train step on an AMD EPYC
(Zen 4), while an earlier record on an Intel Xeon found the opposite.  So
this measures, on the machine it runs on, the trainer's own AdamW step of
the micro spec (``bench.common.DepthbenchStep``: pre_ln, fp32) at a few
widths under each setting of :data:`SETTINGS`.

XLA reads its flags when the backend starts, so each measurement is a fresh
process; the settings alternate (A, B, C, A, B, C ...) so load changes hit
each alike.  A process reports, per shape, the CPU seconds (every thread's,
``time.process_time``) and wall seconds per step over ``--steps`` steps after
one untimed step, and the first step's loss; the table gives medians and the
ratio to the default.  CPU seconds are the measure that matters on a shared
machine (wall time is what the other jobs leave over).  A setting whose
process dies (oneDNN's fusions crashed the train step with SIGILL on Zen 4)
is reported as such, not skipped.

What the product does with the answer: ``depthbench.cpu_dots`` (the CPU
default per vendor, and ``DEPTHBENCH_CPU_DOTS`` to choose).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench import common
from depthbench.cpu_dots import EIGEN_FLAGS

# name -> XLA_FLAGS added for it (the product's own choice is switched off in the
# child: DEPTHBENCH_CPU_DOTS=ynnpack adds nothing to XLA_FLAGS).
SETTINGS = {
    "default (dots on YNNPACK)": "",
    "dots on Eigen (ynn reduce)": EIGEN_FLAGS,
    "XNNPACK dot fusions": f"{EIGEN_FLAGS} --xla_cpu_experimental_xnn_fusion_type=dot",
    "oneDNN dot fusions": f"{EIGEN_FLAGS} --xla_cpu_experimental_onednn_fusion_type=dot",
}
SHAPES = ("128x4", "256x4", "768x2")  # d_model x layers; 8 x 128 tokens, vocabulary 2048


def measure(shapes: list[str], steps: int) -> dict:
    """In this process (XLA_FLAGS already set): per shape, CPU and wall seconds
    per train step and the first step's loss."""
    import time

    import jax

    out = {}
    for shape in shapes:
        d, layers = (int(x) for x in shape.split("x"))
        step = common.DepthbenchStep(common.config_at(d, layers, 128, 8, 2048))
        step.compile()
        step()  # untimed: first-call allocations
        loss = float(jax.device_get(step.metrics["loss"]))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            step()
        out[shape] = {"cpu": (time.process_time() - cpu0) / steps,
                      "wall": (time.perf_counter() - wall0) / steps, "loss": loss}
    return out


def run_one(flags: str, shapes: list[str], steps: int) -> dict | str:
    """One fresh process under ``flags``: its measurements, or why it has none."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip(),
           "JAX_PLATFORMS": "cpu", "DEPTHBENCH_CPU_DOTS": "ynnpack"}
    proc = subprocess.run([sys.executable, "-m", "bench.cpu_dots", "--child", "--steps",
                           str(steps), "--shapes", *shapes], capture_output=True, text=True,
                          env=env, cwd=common.ROOT, check=False)
    if proc.returncode != 0:
        why = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        return f"died ({why})"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarise(results: dict[str, list], shapes: list[str]) -> list[dict]:
    """Medians per setting and shape, each against the default's."""
    base = next(iter(results))
    rows = []
    for shape in shapes:
        ref = [r[shape] for r in results[base] if isinstance(r, dict)]
        ref_cpu = statistics.median(m["cpu"] for m in ref) if ref else float("nan")
        ref_loss = ref[0]["loss"] if ref else None
        for name, runs in results.items():
            done = [r[shape] for r in runs if isinstance(r, dict)]
            if not done:
                rows.append({"shape": shape, "setting": name, "CPU s/step": "-",
                             "wall s/step": "-", "CPU vs default": "-",
                             "first-step loss": next(r for r in runs if isinstance(r, str))})
                continue
            cpu = statistics.median(m["cpu"] for m in done)
            loss = done[0]["loss"]
            rel = abs(loss - ref_loss) / abs(ref_loss) if ref_loss else float("nan")
            rows.append({"shape": shape, "setting": name, "CPU s/step": f"{cpu:.3f}",
                         "wall s/step": f"{statistics.median(m['wall'] for m in done):.3f}",
                         "CPU vs default": f"{cpu / ref_cpu:.2f}x",
                         "first-step loss": f"{loss:.6f} (rel {rel:.0e})"})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES),
                        help="d_model x layers, e.g. 256x4")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.shapes, args.steps)))
        return
    from depthbench import cpu_dots

    print(common.header("XLA:CPU dot back ends: train-step CPU time per setting"))
    print(f"CPU: {cpu_dots.cpu_vendor()} ({cpu_dots.cpu_model()}); the product's default "
          f"here: {cpu_dots.describe(cpu_dots.choice())}")
    results: dict[str, list] = {name: [] for name in args.settings}
    for _ in range(args.rounds):
        for name in args.settings:
            results[name].append(run_one(SETTINGS[name], args.shapes, args.steps))
    print(f"pre_ln AdamW train step, fp32, 8 x 128 tokens, vocabulary 2048; medians of "
          f"{args.rounds} alternating rounds of {args.steps} steps")
    print(common.table(summarise(results, args.shapes)))


if __name__ == "__main__":
    main()
