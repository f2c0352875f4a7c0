"""The measurements of ``python -m bench.accelerator``, one function per part.

Each part takes a :class:`Part` (the shapes to use, ``dry`` or not, and where
its rows go) and emits its rows as it finishes them, so a part stopped by the
watchdog still reports what it measured.  The shapes on an accelerator are
the paper's (``paper_400m``: L24 for MFU, L32 for the family overheads, L70
for memory; bf16 compute on fp32 weights, 2048 tokens a sequence); ``dry``
runs the same code at tiny shapes on a CPU, where the Pallas kernels run in
the interpreter, to prove the script before any device does.

Timings interleave the rows compared (``common.interleaved``); memory is
XLA's account of the compiled step (``common.compiled_memory_bytes``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import gc
import importlib.metadata
import time
from collections.abc import Callable

from bench import common

GIB = 2.0**30
ROUTING = ("hc", "mhc", "attnres_block", "attnres_full", "moda")
# fused.py routes these; mhc's kernels compute every mhc form, so its rows time the
# default (Liger's).
KERNEL_FAMILIES = ("hc", "mhc", "attnres_block", "attnres_full", "moda")
BANKED_FIRST = ("pre_ln", "attnres_full", "attnres_block", "moda", "mhc", "hc")
PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
            "jax-cuda13-pjrt", "libtpu", "flax", "optax")
# --dry: tiny routing settings (fewer streams and Sinkhorn iterations compile faster),
# and one shape for every part, so a part repeats the programs of another and a
# persistent compilation cache (the watchdog sets one for --dry) compiles each once.
DRY_OVERRIDES = ("--config.train.warmup_fraction=0",)
# Tiny routing for --dry, each field for the families that have it.
DRY_FAMILY_FIELDS = {"hc_n": 2, "sinkhorn_iters": 2, "attnres_blocks": 2}
DRY_DEPTH, DRY_BATCH = 2, 2


@dataclasses.dataclass
class Part:
    """One part's run: ``dry`` or accelerator shapes; ``emit(kind, payload)``
    sends a row (``kind='row'``, payload ``{'table': title, 'row': {...}}``),
    a note (``'note'``, ``{'text': ...}``) or facts for the report (``'meta'``)."""

    dry: bool
    emit: Callable[[str, dict], None]

    def row(self, table: str, row: dict) -> None:
        self.emit("row", {"table": table, "row": row})

    def note(self, text: str) -> None:
        self.emit("note", {"text": text})

    def guarded(self, table: str, ident: dict, measure: Callable[[], dict | list[dict]]) -> None:
        """Row(s): ``ident`` and what ``measure()`` returns (a row or a list).
        If it raises (a kernel that does not compile, memory that runs out),
        the row says FAILED, a note gives the error, and the part goes on to
        its next row: an accelerator's minutes are too few to lose the rest."""
        try:
            values = measure()
        except Exception as err:
            first = (str(err).strip().splitlines() or [""])[0][:300]
            self.row(table, {**ident, "result": "FAILED"})
            self.note(f"{' '.join(map(str, ident.values()))}: {type(err).__name__}: {first}")
            gc.collect()
            return
        for row in values if isinstance(values, list) else [values]:
            self.row(table, {**ident, **row})

    # ------------------------------------------------------------ shapes
    @property
    def seq(self) -> int:
        return 16 if self.dry else 2048

    def reps(self, accelerator: int) -> int:
        return 2 if self.dry else accelerator

    def depth(self, paper_depth: int) -> int:
        return DRY_DEPTH if self.dry else paper_depth

    def batch(self, accelerator: int) -> int:
        """Sequences per device."""
        return DRY_BATCH if self.dry else accelerator

    def config(self, family: str, depth: int, batch: int, *, impl: str = "xla",
               dtype: str = "bfloat16", remat: str = "matmuls_saveable", extra=()):
        """The train config of ``family`` at the paper-400m suite's row for
        ``depth`` (``--dry``: width 32, vocabulary 64), ``batch`` sequences per
        device, no matmul recomputed (``matmuls_saveable``)."""
        import jax

        from depthbench import config as config_lib
        from depthbench import variants
        from depthbench.model.residual.protocol import registry

        entry = variants.expand_entry({"model.family": family})  # a variant's fields
        family = entry.pop("model.family")
        fields = [f"--config.model.compute_dtype={dtype}", f"--config.model.impl={impl}",
                  f"--config.model.remat_policy={remat}", *extra,
                  *(f"--config.{key}={value}" for key, value in entry.items())]
        batch *= jax.device_count()
        if self.dry:
            own = registry.get(family).config_fields()
            tiny = [f"--config.model.residual.{key}={value}"
                    for key, value in DRY_FAMILY_FIELDS.items() if key in own]
            return common.config_at(32, depth, self.seq, batch, 64, family=family,
                                    overrides=[*fields, *DRY_OVERRIDES, *tiny])
        return config_lib.load("paper_400m", [
            f"--config.model.family={family}", f"--config.model.depth={depth}",
            f"--config.train.batch_size={batch}", f"--config.train.seq_len={self.seq}",
            *fields])


COMPILE_THREADS = 4


@contextlib.contextmanager
def compile_ahead(keys, config_of):
    """``{key: Future}`` of ``(DepthbenchStep, compile seconds)`` for each key,
    compiled from the abstract state, ``COMPILE_THREADS`` at a time in threads
    (XLA compiles without the GIL), in ``keys``' order: a part that only
    compiles or runs fixed steps takes its rows as they come, and a 400M
    model's compiles, the most of an accelerator's minutes, overlap.  A step's
    failure is its future's exception.  On leaving, compiles not yet started
    are dropped."""

    def build(key):
        step = common.DepthbenchStep(config_of(key), allocate=False)
        return step, step.compile()

    pool = concurrent.futures.ThreadPoolExecutor(COMPILE_THREADS)
    try:
        yield {key: pool.submit(build, key) for key in keys}
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _device():
    import jax

    return jax.devices()[0]


def _bytes_limit() -> int | None:
    """The device memory XLA may use (None where the backend does not say: CPU)."""
    stats = getattr(_device(), "memory_stats", lambda: None)()
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def _shape(step: common.DepthbenchStep) -> str:
    spec, t = step.setup.spec, step.config.train
    return (f"L {spec.depth}, d {spec.d_model}, V {spec.vocab_size}, {t.batch_size} x {t.seq_len}"
            f" tokens, {spec.compute_dtype}")


# ---------------------------------------------------------------- versions
def versions(part: Part) -> None:
    """jax, jaxlib and plugin versions; the device, its count, memory and peaks."""
    import jax

    from bench import kernels
    from depthbench import costs

    part.note(common.header("accelerator"))
    dev = _device()
    part.emit("meta", {"device_kind": dev.device_kind, "platform": dev.platform})
    for name in PACKAGES:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        part.row("packages", {"package": name, "version": version})
    peak = costs.peak_flops(dev.device_kind)
    gbs = kernels.peak_gbs(dev)
    limit = _bytes_limit()
    part.row("device", {
        "device": dev.device_kind, "platform": dev.platform, "count": jax.device_count(),
        "memory (GiB)": "-" if limit is None else limit / GIB,
        "peak bf16 TFLOP/s": "-" if peak is None else peak / 1e12,
        "peak HBM GB/s": "-" if gbs is None else gbs})
    part.note("peaks: dense bf16 FLOP/s from depthbench.costs.peak_flops (vendor datasheets, "
              "cited there); HBM bandwidth from bench/kernels.py PEAK_GBS; '-': none published")


# ---------------------------------------------------------------- MFU
def _attention_impls() -> tuple[str, ...]:
    """cuDNN's fused attention first on a GPU (XLA's otherwise, or if it fails)."""
    return ("cudnn", "xla") if _device().platform == "gpu" else ("xla",)


def mfu(part: Part) -> None:
    """The 400M pre_ln L24 bf16 train step at the largest per-device batch that
    fits (16, 8, 4, 2 sequences of 2048): tokens/s, model FLOP/s and MFU."""
    import jax

    from depthbench import costs

    limit = _bytes_limit()
    attentions = list(_attention_impls())
    step = None
    for batch in (part.batch(2),) if part.dry else (16, 8, 4, 2):
        for attention in list(attentions):
            cfg = part.config("pre_ln", part.depth(24), batch,
                              extra=[f"--config.model.attention_impl={attention}"])
            try:  # compiled from the abstract state: nothing allocated before it fits
                step = common.DepthbenchStep(cfg, allocate=False)
                compile_s = step.compile()
                break
            except Exception as err:  # cuDNN refusing the shape, or no memory to compile in
                part.note(f"batch {batch}, attention {attention}: {type(err).__name__}: "
                          f"{(str(err).strip().splitlines() or [''])[0][:200]}")
                step = None
                if len(attentions) > 1:
                    attentions.remove(attention)  # not tried again at smaller batches
                gc.collect()
        if step is None:
            continue
        mem = step.memory_bytes()
        if limit is None or mem <= 0.92 * limit:
            break
        part.note(f"batch {batch}: {mem / GIB:.1f} GiB > 92% of {limit / GIB:.1f} GiB; smaller")
        step = None
        gc.collect()
    if step is None:
        raise RuntimeError("no batch fitted")
    step()  # the first run (allocation, autotuning caches)
    reps = part.reps(10)
    sec = common.interleaved({"step": step}, reps)["step"]
    spec, seq = step.setup.spec, int(step.config.train.seq_len)
    flops = costs.model_flops_per_step(spec, seq, step.tokens)
    kind = _device().device_kind
    util = costs.mfu(flops / sec, kind, jax.device_count())
    part.row("MFU", {
        "shape": _shape(step), "params (M)": costs.param_count(spec) / 1e6,
        "attention": step.config.model.attention_impl,
        "batch / device": step.config.train.batch_size // jax.device_count(),
        "compile (s)": compile_s, "step (ms)": 1e3 * sec, "tokens/s": step.tokens / sec,
        "model TFLOP/s": flops / sec / 1e12,
        "MFU": "- (no published peak)" if util is None else f"{100 * util:.1f}%",
        "memory (GiB)": step.memory_bytes() / GIB, "loss": float(step.metrics["loss"])})
    part.note(f"median of {reps} steps; model FLOPs = depthbench.costs.model_flops_per_step "
              "(6N per token + attention), remat matmuls_saveable (no matmul recomputed); "
              "goal on an accelerator: MFU >= 45%")


# ---------------------------------------------------------------- families
def families(part: Part) -> None:
    """Step time and memory of each routing family relative to pre_ln at L32,
    with ``model.impl`` xla and, for the kernel families, pallas."""
    depth, batch = part.depth(32), part.batch(8)
    reps = part.reps(8)
    table = f"step and memory vs pre_ln, L {depth} (median of {reps} interleaved pairs)"

    # Every xla row before any pallas row: the kernels' compiles are the unknown.
    rows = ([(f, "xla") for f in dict.fromkeys(ROUTING + KERNEL_FAMILIES)]
            + [(f, "pallas") for f in KERNEL_FAMILIES])
    keys = [("pre_ln", "xla"), *rows]
    with compile_ahead(keys, lambda key: part.config(key[0], depth, batch, impl=key[1])) as ready:
        # All compiles end before any timing: a compiling thread would take the
        # GIL from the timed steps' dispatch.  What each compile gave is noted
        # as it comes, so a part stopped here still shows it.
        names = {future: key for key, future in ready.items()}
        for future in concurrent.futures.as_completed(names):
            family, impl = names[future]
            if future.exception() is None:
                step, seconds = future.result()
                part.note(f"compiled {family} {impl}: {seconds:.0f} s, "
                          f"{step.memory_bytes() / GIB:.3g} GiB")
        base, base_compile = ready[("pre_ln", "xla")].result()
        base()
        base_mem = base.memory_bytes()
        part.row(table, {"family": "pre_ln", "impl": "xla", "compile (s)": base_compile,
                         "step (ms)": float("nan"), "time / pre_ln": "1.00x",
                         "memory (GiB)": base_mem / GIB, "memory / pre_ln": "1.00x"})
        part.note(f"shape: {_shape(base)}")

        def against_base(key) -> dict:
            step, compile_s = ready[key].result()
            step()
            pairs = [common.interleaved({"pre_ln": base, key: step}, 1) for _ in range(reps)]
            ratio = sorted(p[key] / p["pre_ln"] for p in pairs)[reps // 2]
            mem = step.memory_bytes()
            step.release()
            gc.collect()
            return {"compile (s)": compile_s,
                    "step (ms)": 1e3 * sorted(p[key] for p in pairs)[reps // 2],
                    "time / pre_ln": f"{ratio:.2f}x", "memory (GiB)": mem / GIB,
                    "memory / pre_ln": f"{mem / base_mem:.2f}x"}

        for key in rows:
            part.guarded(table, {"family": key[0], "impl": key[1]},
                         lambda k=key: against_base(k))
    part.note(f"compiles ran {COMPILE_THREADS} at a time, all before the timing (their seconds "
              "overlap); each step's state is created only when it is timed")
    if part.dry:
        part.note("pallas rows on a CPU: the Pallas interpreter, not a kernel timing")
    part.note("goals on an accelerator: mhc within 6.7% of pre_ln (DeepSeek), attnres_block "
              "within 4% (Kimi), hc within 7% (marin)")


def memory(part: Part) -> None:
    """Compiled memory of the banked families and the others at L70, against
    pre_ln (compiled only: nothing runs)."""
    depth, batch = part.depth(70), part.batch(8)
    base = None
    table = f"memory at L {depth} (compiled, XLA memory_analysis)"

    def compiled(ready, family) -> dict:
        nonlocal base
        step, compile_s = ready[family].result()
        mem = step.memory_bytes()
        if family == "pre_ln":
            base = mem
            part.note(f"shape: {_shape(step)}")
        return {"compile (s)": compile_s, "memory (GiB)": mem / GIB,
                "memory / pre_ln": f"{mem / base:.2f}x" if base else "-"}

    with compile_ahead(BANKED_FIRST, lambda f: part.config(f, depth, batch)) as ready:
        for family in BANKED_FIRST:
            part.guarded(table, {"family": family}, lambda f=family: compiled(ready, f))
    part.note("goal (depth_memory.md): attnres_full and moda <= 3x pre_ln at L70")


# ---------------------------------------------------------------- kernels
def kernels_alone(part: Part) -> None:
    """Each Pallas kernel against its XLA reference, forward and forward +
    backward: times, ratio and achieved bandwidth (bench/kernels.py)."""
    import jax.numpy as jnp

    import pallas_kernels as pk
    from bench import kernels

    tokens, d = (64, 32) if part.dry else (16384, 1024)
    sources, n = ([3], 2) if part.dry else ([9, 17], 4)
    target = pk.resolve("auto")
    todo = kernels.cases(tokens, d, sources, n, jnp.bfloat16, target, iters=2 if part.dry else 20)
    peak = kernels.peak_gbs(_device())
    reps = part.reps(20)
    table = f"kernels: {tokens} tokens, d {d}, bf16 (median of {reps})"

    def timed(case) -> list[dict]:
        rows = kernels.measure([case], ["fwd", "fwd+bwd"], reps)
        for row in rows:
            row["% of peak"] = "-" if peak is None else f"{100 * row['pallas_gbs'] / peak:.1f}%"
            row["MB moved"] = row.pop("bytes") / 1e6
        return rows

    for case in todo:
        part.guarded(table, {"kernel": case[0]}, lambda c=case: timed(c))
    mode = "interpreted (times measure the interpreter)" if target.interpret else "compiled"
    part.note(f"kernels {mode}, {target.kind} tiling; ratio = xla / pallas (goal >= 1.5x), "
              "GB/s = least bytes moved / time (goal > 70% of peak)")


# ---------------------------------------------------------------- precision
def precision(part: Part) -> None:
    """bf16 against fp32 losses over ~30 steps of every routing family (and
    pre_ln), same initialisation and batch, ``model.impl=auto``."""
    from depthbench.model.residual.parts import fused

    steps = 4 if part.dry else 30
    table = f"bf16 vs fp32 losses over {steps} steps"

    def config(key):
        family, dtype = key
        if part.dry:
            return part.config(family, part.depth(24), part.batch(2), impl="auto", dtype=dtype)
        return common.config_at(256, 8, 256, 8, 2048, family=family, overrides=[  # numerics
            f"--config.model.compute_dtype={dtype}", "--config.model.impl=auto",
            "--config.train.warmup_fraction=0"])

    def losses_of(ready, family: str) -> dict:
        losses = {}
        for dtype in ("float32", "bfloat16"):
            step, _ = ready[(family, dtype)].result()
            losses[dtype] = []
            for _ in range(steps):
                step()
                losses[dtype].append(float(step.metrics["loss"]))
            impl = "pallas" if fused.use_pallas(step.setup.spec) else "xla"
            step.release()
            gc.collect()
        f32, b16 = losses["float32"], losses["bfloat16"]
        return {"impl": impl, "fp32 first": f32[0], "fp32 last": f32[-1], "bf16 last": b16[-1],
                "max abs(bf16 - fp32)": max(abs(a - b) for a, b in zip(f32, b16, strict=True)),
                "last rel. diff": f"{100 * abs(b16[-1] - f32[-1]) / abs(f32[-1]):.2f}%"}

    names = ("pre_ln", *ROUTING)
    with compile_ahead([(f, d) for f in names for d in ("float32", "bfloat16")], config) as ready:
        for family in names:
            part.guarded(table, {"family": family}, lambda f=family: losses_of(ready, f))
    shape = "d 32, L 2, 2 x 16 tokens" if part.dry else "d 256, L 8, 8 x 256 tokens, V 2048"
    part.note(f"{shape}; one fixed random batch (the losses fall as it is memorised), AdamW "
              "at lr 3e-3 without warm-up; fp32 master weights in both")


def inference(part: Part) -> None:
    """Decode latency and KV cache against depth (bench/inference.py)."""
    from bench.inference import accelerator_part

    accelerator_part(part)


PARTS: dict[str, Callable[[Part], None]] = {
    "versions": versions,
    "mfu": mfu,
    "families": families,
    "kernels": kernels_alone,
    "precision": precision,
    "memory": memory,
    "inference": inference,
}


def run(name: str, part: Part) -> float:
    """Run part ``name``; returns its seconds."""
    t0 = time.perf_counter()
    PARTS[name](part)
    return time.perf_counter() - t0
