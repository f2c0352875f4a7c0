"""The depthbench tables other than the peer comparison: compile time against
depth, per-family step time and memory relative to pre_ln, throughput and MFU.

Step times of the rows being compared are measured interleaved (one step of
each in turn, repeated) and reported as medians and ratios.  Memory is XLA's
own account of the compiled step (``memory_analysis``: arguments + outputs +
temporaries), which does not depend on machine load.  On a CPU there is no
published peak, so MFU is given against the fp32 matmul rate measured in the
same run (a 1024^3 product) and labelled so; ``costs.mfu`` is used where the
device's peak is known.
"""

from __future__ import annotations

import time

from bench import common


def _families(only=None) -> list[str]:
    from depthbench.model.residual.protocol import registry

    return [f for f in registry.names() if not only or f in only]


def compile_vs_depth(families=None, d_model: int = 64, depths=(8, 64)) -> str:
    """Seconds to lower and compile the train step at each depth, per family."""
    rows = []
    for fam in _families(families):
        row = {"family": fam}
        for depth in depths:
            step = common.DepthbenchStep(common.config_at(d_model, depth, 64, 4, 512, family=fam))
            row[f"L {depth} (s)"] = step.compile_seconds()
        deep, shallow = row[f"L {depths[-1]} (s)"], row[f"L {depths[0]} (s)"]
        row[f"L {depths[-1]} / L {depths[0]}"] = f"{deep / shallow:.2f}x"
        rows.append(row)
    return "\n".join([common.header(f"compile time vs depth (d {d_model}, T 64, B 4, V 512)"),
                      common.table(rows), "flat in depth means the layer scan compiles one block"])


def _memory_bytes(step: common.DepthbenchStep) -> int:
    with step.setup.context():
        return common.compiled_memory_bytes(
            step.step.jitted.lower(step.state, step.batch).compile())


def paired_ratios(base, steps: dict, reps: int) -> tuple[dict, dict]:
    """Each step's time relative to ``base``'s, measured in pairs: per repetition,
    for every step in turn, one ``base`` step then one of it.  Returns the median
    of each step's per-pair ratios and its median seconds (``base`` under its own
    name, ratio 1).  A pair runs back to back, so a load change or the process's
    drift between pairs moves both of its steps alike: the ratios of medians of
    the steps interleaved in one round (pre_ln, hc, mhc ...) moved by up to a third
    between two runs of the same code on the shared 2-core machine."""
    import statistics

    ratios = {k: [] for k in steps}
    seconds = {k: [] for k in steps}
    seconds["base"] = []
    for _ in range(reps):
        for name, step in steps.items():
            t0 = time.perf_counter()
            base()
            t1 = time.perf_counter()
            step()
            t2 = time.perf_counter()
            seconds["base"].append(t1 - t0)
            seconds[name].append(t2 - t1)
            ratios[name].append((t2 - t1) / (t1 - t0))
    return ({k: statistics.median(v) for k, v in ratios.items()},
            {k: statistics.median(v) for k, v in seconds.items()})


def families_vs_pre_ln(families=None, reps: int = 3) -> str:
    """Step time and compiled memory of every family relative to pre_ln (time:
    the median of per-pair ratios, :func:`paired_ratios`)."""
    out = [common.header("step time and memory per family relative to pre_ln "
                         "(fp32, each step paired with one of pre_ln's)")]
    for label, (d, depth) in (("shallow-wide", (256, 4)), ("deep-narrow", (64, 32))):
        steps = {}
        for fam in ["pre_ln", *[f for f in _families(families) if f != "pre_ln"]]:
            steps[fam] = common.DepthbenchStep(common.config_at(d, depth, 64, 8, 2048, family=fam))
            steps[fam]()  # compile
        base = steps.pop("pre_ln")
        ratio, sec = paired_ratios(base, steps, reps)
        base_m = _memory_bytes(base)
        rows = [{"family": "pre_ln", "step (ms)": 1e3 * sec["base"], "time / pre_ln": "1.00x",
                 "memory (MiB)": base_m / 2**20, "memory / pre_ln": "1.00x"}]
        for fam, step in steps.items():
            mem = _memory_bytes(step)
            rows.append({"family": fam, "step (ms)": 1e3 * sec[fam],
                         "time / pre_ln": f"{ratio[fam]:.2f}x",
                         "memory (MiB)": mem / 2**20, "memory / pre_ln": f"{mem / base_m:.2f}x"})
        out += [f"\n{label}: d {d}, L {depth}, T 64, B 8, V 2048 (median of {reps} pairs)",
                common.table(rows)]
    out.append("memory: XLA memory_analysis of the compiled step "
               "(arguments + outputs + temporaries)")
    return "\n".join(out)


def _matmul_rate() -> float:
    """fp32 FLOP/s of a 1024^3 matmul on this machine (median of 5)."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((1024, 1024), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    sec = common.interleaved({"mm": lambda: f(a).block_until_ready()}, 5)["mm"]
    return 2 * 1024**3 / sec


def throughput(reps: int = 3) -> str:
    """Tokens/s and MFU of the micro config and a 100M-class config."""
    import jax

    from depthbench import config as config_lib
    from depthbench import costs

    shapes = {"micro (pre_ln L4)": config_lib.load("micro", []),
              "100M-class (d 768, L 12, V 32000)": common.config_at(768, 12, 256, 2, 32000)}
    steps = {k: common.DepthbenchStep(c) for k, c in shapes.items()}
    for s in steps.values():
        s()
    sec = common.interleaved(steps, reps)
    peak = _matmul_rate()
    dev = jax.devices()[0]
    rows = []
    for name, s in steps.items():
        spec = s.setup.spec
        flops = costs.model_flops_per_step(spec, int(s.config.train.seq_len), s.tokens)
        known = costs.mfu(flops / sec[name], dev.device_kind, jax.device_count())
        rows.append({"config": name, "params": costs.param_count(spec),
                     "tok/s": s.tokens / sec[name], "model TFLOP/s": flops / sec[name] / 1e12,
                     "MFU": "-" if known is None else f"{100 * known:.1f}%",
                     "of matmul rate": f"{100 * flops / sec[name] / peak:.1f}%"})
    return "\n".join([
        common.header("throughput and MFU (fp32)"), common.table(rows),
        f"device {dev.device_kind}: MFU needs a published peak ('-' when unknown); "
        f"'of matmul rate' divides by this run's 1024^3 fp32 matmul rate, {peak / 1e9:.1f} GFLOP/s "
        f"(median of {reps} steps, at {time.strftime('%H:%M')})"])
