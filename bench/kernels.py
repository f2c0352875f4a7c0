"""Do the Pallas kernels beat their XLA references, and how close to the memory roofline?

Times, side by side in one run on the machine at hand, each fused kernel of
``pallas_kernels`` against its pure-jnp reference (what the model's XLA path
computes), forward alone and forward + backward (``jax.vjp`` with a unit
cotangent), and prints per case:

* the median time of each (ms) and the ratio ``xla / pallas`` (goal on an
  accelerator: >= 1.5x);
* achieved bandwidth: the bytes the operation must move at least (every
  input read once, every output written once, at the arrays' dtypes),
  divided by the time; and that as a share of the chip's peak HBM bandwidth
  where the device kind is known (goal: > 70%).

Kernels: AttnRes depth attention (``S`` = 9 and 17 sources), the HC/mHC
post-mix, HC pre-mix and mHC pre-mix (``n`` = 4 streams, 20 Sinkhorn
iterations), MoDA's joint softmax (sequence and depth keys, ``m`` = the
largest ``S`` slots in each of two depth groups).  On CPU the kernels run in
the Pallas *interpreter*, so their times measure the interpreter, not the
kernel; the run says so, and its
default shapes are small (a smoke test of the benchmark that finishes in
about a minute).  ``--realistic`` uses 16k tokens, d 1024 (the issue's
shapes; minutes on CPU).  ``--model`` adds the train-step time of hc, mhc,
attnres_block, attnres_full and moda relative to pre_ln, with ``model.impl`` xla
and pallas (goals on an accelerator: mhc within 6%, attnres_block within 3%);
on CPU that takes minutes per family (the interpreter's compile), so it is
opt-in.

    python bench/kernels.py                    # small shapes (CPU: interpreter)
    python bench/kernels.py --realistic        # tokens 16384, d 1024, S 9 and 17, n 4
    python bench/kernels.py --realistic --json out.json
    python bench/kernels.py --model            # + train-step time vs pre_ln, xla vs pallas
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from tqdm import tqdm

import pallas_kernels as pk

# Peak HBM bandwidth (GB/s) by device-kind substring, from the vendors' spec sheets.
PEAK_GBS = {
    "H200": 4800.0,
    "H100": 3350.0,
    "A100": 2039.0,
    "TPU v6": 1640.0,
    "TPU v5p": 2765.0,
    "TPU v5 lite": 819.0,
    "TPU v5e": 819.0,
    "TPU v4": 1228.0,
}


def peak_gbs(device) -> float | None:
    kind = getattr(device, "device_kind", "")
    for key, gbs in PEAK_GBS.items():
        if key.lower() in kind.lower():
            return gbs
    return None


def median_seconds(fn, args, repeats: int) -> float:
    out = fn(*args)
    jax.block_until_ready(out)  # compile + warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def nbytes(*arrays) -> int:
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(arrays))


def with_backward(fn, argnums):
    """Forward + backward: the vjp of ``fn`` w.r.t. ``argnums`` with a unit cotangent."""

    def run(*args):
        def part(*d):
            full = list(args)
            for i, x in zip(argnums, d, strict=True):
                full[i] = x
            return fn(*full)

        out, pullback = jax.vjp(part, *(args[i] for i in argnums))
        return out, pullback(jax.tree.map(jnp.ones_like, out))

    return run


def cases(tokens: int, d: int, sources: list[int], n: int, dtype, backend: str, iters: int = 20):
    """(name, fused, reference, args, differentiable argnums); ``iters``: mHC's
    Sinkhorn iterations."""
    keys = iter(jax.random.split(jax.random.key(0), 32))
    normal = lambda shape, dt=jnp.float32, s=1.0: (s * jax.random.normal(next(keys), shape)).astype(
        dt
    )
    out = []
    for n_src in sources:
        v = normal((n_src, tokens, d), dtype)
        valid = jnp.arange(n_src) < n_src  # every source valid (the readout's mix)
        args = (v, valid, normal((d,)), 1.0 + normal((d,), s=0.1))
        out.append(
            (
                f"depth_attention S={n_src}",
                lambda v, m, q, w: pk.depth_attention(v, m, q, w, 1e-6, backend),
                lambda v, m, q, w: pk.depth_attention_reference(v, m, q, w, 1e-6),
                args,
                (0, 2, 3),
            )
        )
    h = normal((n, tokens, d), dtype)
    post_args = (
        h,
        jax.nn.softmax(normal((n, tokens, n)), -1),
        normal((n, tokens)),
        normal((tokens, d), dtype),
    )
    out.append(
        (
            f"stream_post n={n}",
            lambda *a: pk.stream_post(*a, backend=backend),
            pk.stream_post_reference,
            post_args,
            (0, 1, 2, 3),
        )
    )
    hc_args = (h, normal((d, n + 2), s=0.02), normal((n, n + 2)), normal((n + 2,), s=0.01))
    out.append(
        (
            f"hc_pre n={n}",
            lambda *a: pk.hc_pre(*a, use_tanh=True, backend=backend),
            lambda *a: pk.hc_pre_reference(*a, True),
            hc_args,
            (0, 1, 2, 3),
        )
    )
    m = n * n + 2 * n
    mhc_args = (h, normal((n, d, m), s=0.02), normal((m,), s=0.01), normal((m,)))
    sk = {"iters": iters, "temperature": 1.0, "eps": 1e-6}
    out.append(
        (
            f"mhc_pre n={n}",
            lambda *a: pk.mhc_pre(*a, backend=backend, **sk),
            lambda *a: pk.mhc_pre_reference(*a, n, **sk),
            mhc_args,
            (0, 1, 2, 3),
        )
    )
    # the default mhc: Liger's form (linear Sinkhorn with eps, R[out, in], bf16 phi)
    liger = {"sinkhorn": "linear", "sinkhorn_eps": 1e-6, "layout": "out_in"}
    liger_args = (h, mhc_args[1].astype(jnp.bfloat16), *mhc_args[2:])
    out.append(
        (
            f"mhc_pre n={n} liger",
            lambda *a: pk.mhc_pre(*a, backend=backend, **sk, **liger),
            lambda *a: pk.mhc_pre_reference(*a, n, **sk, **liger),
            liger_args,
            (0, 1, 2, 3),
        )
    )
    out.append(moda_case(tokens, d, max(sources), dtype, backend, normal))
    return out


def moda_case(tokens: int, d: int, slots: int, dtype, backend, normal):
    """MoDA's joint softmax: rows of up to 2048 tokens, heads of 128 (or ``d``),
    key heads a quarter of them (GQA), two depth groups (the attention and MLP
    slots) of ``slots`` slots, the last third masked (a block midway down the
    stack), against the model's XLA path (``attention_with_depth``)."""
    from depthbench.model.residual.parts.moda_attention import attention_with_depth

    seq = min(tokens, 2048)
    b, h = max(1, tokens // seq), min(d, 128)
    n = max(1, d // h)
    kv = max(1, n // 4)
    valid = jnp.arange(slots) < slots - slots // 3

    def groups(depth):
        return [(depth[0], depth[1], valid), (depth[2], depth[3], valid)]

    args = (normal((b, seq, n, h), dtype), normal((b, seq, kv, h), dtype),
            normal((b, seq, kv, h), dtype), normal((b, seq, n, h), dtype),
            *(normal((b, seq, kv, slots, h), dtype) for _ in range(4)))
    return (
        f"moda_attention m={slots}",
        lambda q, k, v, qd, *dp: pk.moda_attention(q, k, v, qd, groups(dp), backend),
        lambda q, k, v, qd, *dp: attention_with_depth(q, k, v, qd, groups(dp)),
        args,
        tuple(range(8)),
    )


def measure(todo, passes, repeats: int) -> list[dict]:
    """Time each case of :func:`cases`, fused against reference, for each of
    ``passes`` (``fwd``, ``fwd+bwd``): one row per case and pass, with the
    medians (ms), their ratio, the bytes moved and the achieved GB/s."""
    rows = []
    for name, fused, ref, args, argnums in tqdm(todo, desc="kernels", file=sys.stderr):
        for mode in passes:
            f, r = (
                (fused, ref)
                if mode == "fwd"
                else (with_backward(fused, argnums), with_backward(ref, argnums))
            )
            f, r = jax.jit(f), jax.jit(r)
            moved = nbytes(args, jax.eval_shape(r, *args))
            t_f, t_r = median_seconds(f, args, repeats), median_seconds(r, args, repeats)
            rows.append(
                {
                    "kernel": name, "pass": mode, "pallas_ms": 1e3 * t_f, "xla_ms": 1e3 * t_r,
                    "ratio": t_r / t_f, "bytes": moved,
                    "pallas_gbs": moved / t_f / 1e9, "xla_gbs": moved / t_r / 1e9,
                }
            )  # fmt: skip
    return rows


MODEL_FAMILIES = ("hc", "mhc", "attnres_block", "attnres_full", "moda")


def model_level(a, repeats: int, target) -> None:
    """Train-step time (loss and gradients) of each routing family relative to
    pre_ln at the same shape, with ``model.impl`` xla and pallas."""
    import optax
    from flax import linen as nn

    from depthbench.model.spec import ModelSpec
    from depthbench.model.transformer import Transformer
    from depthbench.shapes import Shape

    depth, d = a.model_depth, a.model_d
    shape = Shape(depth, d, 4 * d, max(1, d // 64), max(1, d // 128), 256)
    tokens = jax.random.randint(jax.random.key(0), (a.model_batch, a.model_seq + 1), 0, 256)

    def step_time(family: str, impl: str) -> float:
        spec = ModelSpec.from_shape(shape, family=family, compute_dtype=a.dtype).replace(impl=impl)
        model = Transformer(spec)
        params = nn.unbox(model.init(jax.random.key(1), tokens[:, :-1])["params"])

        def loss(p):
            logits = model.apply({"params": p}, tokens[:, :-1])[0].astype(jnp.float32)
            labels = tokens[:, 1:]
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        return median_seconds(jax.jit(jax.value_and_grad(loss)), (params,), repeats)

    print(
        f"model level: train step (loss + grads), depth {depth}, d {d}, "
        f"{a.model_batch} x {a.model_seq} tokens, {a.dtype}, relative to pre_ln"
    )
    base = step_time("pre_ln", "xla")
    print(f"{'family':<14} {'xla':>8} {'pallas':>8}   (pre_ln {1e3 * base:.2f} ms)")
    for family in tqdm(MODEL_FAMILIES, desc="model", file=sys.stderr):
        t_x, t_p = step_time(family, "xla"), step_time(family, "pallas")
        print(f"{family:<14} {t_x / base:7.2f}x {t_p / base:7.2f}x")
    if target.interpret:
        print("(pallas column: interpreted kernels on CPU, not a kernel timing)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--realistic", action="store_true", help="tokens 16384, d 1024")
    ap.add_argument(
        "--tokens", type=int, default=None, help="tokens (default 512; 16384 realistic)"
    )
    ap.add_argument("--d", type=int, default=None, help="width (default 128; 1024 realistic)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls (default 3 CPU, 20)")
    ap.add_argument("--backend", default="auto", choices=list(pk.BACKENDS))
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--model", action="store_true", help="also time model train steps")
    ap.add_argument("--model-depth", type=int, default=4)
    ap.add_argument("--model-d", type=int, default=128)
    ap.add_argument("--model-batch", type=int, default=2)
    ap.add_argument("--model-seq", type=int, default=64)
    a = ap.parse_args(argv)

    device = jax.devices()[0]
    on_cpu = device.platform == "cpu"
    target = pk.resolve(a.backend)
    tokens = a.tokens or (16384 if a.realistic else 512)
    d = a.d or (1024 if a.realistic else 128)
    repeats = a.repeats or (3 if on_cpu else 20)
    peak = peak_gbs(device)
    print(f"device: {device.device_kind} ({device.platform}); jax {jax.__version__}")
    print(
        f"kernels: {'interpreted' if target.interpret else 'compiled'} "
        f"({target.kind} tiling rules); tokens {tokens}, d {d}, {a.dtype}, median of {repeats}"
    )
    if target.interpret:
        print(
            "NOTE: the Pallas kernels run in the interpreter here (no TPU/GPU), so their "
            "times measure the interpreter, not the kernels; only the XLA column and the "
            "bytes are meaningful. Run on an accelerator for the real ratios."
        )
    todo = cases(tokens, d, [9, 17], a.streams, jnp.dtype(a.dtype), target)
    rows = measure(todo, ["fwd"] if a.forward_only else ["fwd", "fwd+bwd"], repeats)
    header = f"{'kernel':<22} {'pass':<8} {'pallas ms':>10} {'xla ms':>10} {'xla/pallas':>10} "
    header += f"{'MB moved':>9} {'pallas GB/s':>12} {'xla GB/s':>9} {'% peak':>7}"
    print(header)
    for row in rows:
        share = f"{100 * row['pallas_gbs'] / peak:6.1f}%" if peak else "    n/a"
        print(
            f"{row['kernel']:<22} {row['pass']:<8} {row['pallas_ms']:10.3f} {row['xla_ms']:10.3f} "
            f"{row['ratio']:10.2f} {row['bytes'] / 1e6:9.1f} {row['pallas_gbs']:12.1f} "
            f"{row['xla_gbs']:9.1f} {share}"
        )
    if peak is None:
        print(f"(peak bandwidth of '{device.device_kind}' unknown: no % of peak)")
    if a.model:
        model_level(a, repeats, target)
    else:
        print("model level (step time vs pre_ln, xla vs pallas): add --model")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": device.device_kind, "tokens": tokens, "d": d, "rows": rows}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
