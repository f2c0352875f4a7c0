"""depthbench's train step against the PyTorch peer (transformers' LlamaForCausalLM).

Same shape, batch and work: forward, fp32 cross entropy over the vocabulary,
backward, global-norm clipping and AdamW, fp32, compile excluded.  Both run
every matmul once: depthbench under the micro config's remat policy
(``matmuls_saveable``: matmul outputs kept, the elementwise work between them
recomputed in the backward; ``--remat none`` keeps everything, as torch does).
The two stacks' steps run interleaved (depthbench, torch, depthbench, torch
...) so machine load hits both alike; the table gives the median of each and
their ratio (goal >= 1.0x).  torch and transformers come from the optional
extra ``depthbench[peer]``; without them this prints why and skips.

    python -m bench.peer                # the issue's three shapes
    python -m bench.peer --quick        # fewer steps
    python -m bench.peer --remat none   # depthbench keeping every residual
"""

from __future__ import annotations

import argparse
import sys
import time

from bench import common

# (d_model, depth, seq_len, batch, vocab): the shapes of issue 15.
SHAPES = ((128, 4, 128, 16, 2048), (256, 8, 256, 16, 8192), (768, 12, 512, 4, 32000))
# Sleep before each timed step: torch's OpenMP threads spin after its step and
# would slow the depthbench step that follows (common.interleaved).
PAUSE = 0.25


class TorchStep:
    """LlamaForCausalLM with the same shape as a depthbench spec; one call =
    one training step (logits, CE, backward, clip, AdamW)."""

    def __init__(self, spec, batch: int, seq_len: int, lr: float, clip: float, seed: int = 0):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(seed)
        cfg = LlamaConfig(
            vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=spec.d_ff,
            num_hidden_layers=spec.depth, num_attention_heads=spec.n_heads,
            num_key_value_heads=spec.n_kv_heads, max_position_embeddings=seq_len,
            rms_norm_eps=spec.norm_eps, rope_theta=spec.rope_theta, tie_word_embeddings=False,
            attention_bias=False, mlp_bias=False, attn_implementation="sdpa",
        )
        self.torch = torch
        self.model = LlamaForCausalLM(cfg).float().train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.1)
        self.clip = clip
        self.inputs = torch.randint(0, spec.vocab_size, (batch, seq_len))
        self.targets = torch.randint(0, spec.vocab_size, (batch, seq_len))

    def __call__(self) -> None:
        torch = self.torch
        logits = self.model(input_ids=self.inputs, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), self.targets.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.loss = float(loss.detach())


def torch_missing() -> str | None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return (f"skipped: the PyTorch peer needs torch and transformers ({e}); "
                "pip install 'depthbench[peer]'")
    return None


def run(quick: bool = False, shapes=SHAPES, remat: str = "matmuls_saveable") -> str:
    """The peer table (or the line saying why it is skipped)."""
    out = [common.header("train step vs PyTorch peer (LlamaForCausalLM), fp32, interleaved, "
                         f"depthbench remat policy {remat}")]
    missing = torch_missing()
    if missing:
        return "\n".join([*out, missing])
    import torch

    out[0] += f"; torch {torch.__version__} ({torch.get_num_threads()} threads)"
    reps = 3 if quick else 5
    rows, mm_rows = [], []
    for d, depth, t, b, v in shapes:
        config = common.config_at(d, depth, t, b, v,
                                  overrides=[f"--config.model.remat_policy={remat}"])
        ours = common.DepthbenchStep(config)
        peer = TorchStep(ours.setup.spec, b, t, float(config.train.lr),
                         float(config.train.clip_norm))
        for _ in range(2):  # compile; the second round because the first steps still
            ours()           # grow the heap (page faults, where freed memory is kept)
            peer()
        sec = common.interleaved({"depthbench": ours, "torch": peer}, reps, pause=PAUSE)
        rows.append({
            "shape": f"d {d}, L {depth}, T {t}, B {b}, V {v}",
            "depthbench tok/s": ours.tokens / sec["depthbench"],
            "torch tok/s": ours.tokens / sec["torch"],
            "ratio": f"{sec['torch'] / sec['depthbench']:.2f}x",
        })
        mm_rows += matmul_rows(f"d {d}", b * t, d, ours.setup.spec.d_ff, v, reps)
    out.append(common.table(rows))
    out.append(f"median of {reps} interleaved steps each; ratio = torch step time / depthbench's "
               "(goal >= 1.00x)")
    out += ["", "the step's 2-D products alone, fp32, jax (XLA:CPU's kernels; one jitted call "
            "each, dispatch included) vs torch, interleaved, and numpy's BLAS "
            f"({numpy_blas()}) timed after them as a third GEMM (M x K x N):",
            common.table(mm_rows),
            f"median of {3 * reps} products each; ratio = torch time / jax's. Matmuls are most "
            "of either step, so where jax's kernels trail, the step does too."]
    return "\n".join(out)


def matmul_rows(shape: str, n: int, d: int, f: int, v: int, reps: int) -> list[dict]:
    """One shape's 2-D products as the step runs them (a projection ``x W``, its
    input gradient ``g W^T`` and weight gradient ``x^T g``, the head ``x W``),
    each timed alone in jax and in torch, interleaved."""
    import numpy as np

    rng = np.random.default_rng(0)
    products = (  # name, operand shapes as stored, the product, its M x K x N
        ("x W", (n, d), (d, f), lambda a, b: a @ b, (n, d, f)),
        ("g W^T", (n, f), (d, f), lambda a, b: a @ b.T, (n, f, d)),
        ("x^T g", (n, d), (n, f), lambda a, b: a.T @ b, (d, n, f)),
        ("head x W", (n, d), (d, v), lambda a, b: a @ b, (n, d, v)))
    rows = []
    for name, a_shape, b_shape, fn, (m, k, cols) in products:
        a, b = (rng.standard_normal(x, np.float32) for x in (a_shape, b_shape))
        sec = _time_product(fn, a, b, 3 * reps)
        flop = 2 * m * k * cols
        rows.append({"shape": shape, "product": f"{name}, {m}x{k}x{cols}",
                     "jax GFLOP/s": flop / sec["jax"] / 1e9,
                     "torch GFLOP/s": flop / sec["torch"] / 1e9,
                     "numpy GFLOP/s": flop / sec["numpy"] / 1e9,
                     "ratio": f"{sec['torch'] / sec['jax']:.2f}x"})
    return rows


def numpy_blas() -> str:
    """The BLAS numpy was built with ("openblas 0.3.x"), or "unknown"."""
    import numpy as np

    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas['name']} {blas.get('version', '')}".strip()
    except (TypeError, KeyError, AttributeError):  # numpy < 1.26 has no mode="dicts"
        return "unknown"


def _time_product(fn, a, b, reps: int) -> dict[str, float]:
    """Median seconds of ``fn(a, b)`` jitted in jax, eager in torch and in numpy
    (its own BLAS), interleaved."""
    import jax
    import torch

    ja, jb, ta, tb = jax.numpy.asarray(a), jax.numpy.asarray(b), torch.tensor(a), torch.tensor(b)
    jitted = jax.jit(fn)
    calls = {"jax": lambda: jitted(ja, jb).block_until_ready(), "torch": lambda: fn(ta, tb)}
    for call in calls.values():
        call()
    sec = common.interleaved(calls, reps, warm=True)
    # numpy after, not interleaved: OpenBLAS's threads spin for about 0.1 s after
    # a call and starved the next torch or jax product (torch's g W^T at 23
    # against 150 GFLOP/s on a 2-core Xeon); the sleep lets them settle.
    sec.update(common.interleaved({"numpy": lambda: fn(a, b)}, reps, warm=True))
    time.sleep(0.3)
    return sec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 timed steps instead of 5")
    p.add_argument("--shape", type=int, nargs=5, action="append",
                   metavar=("D", "L", "T", "B", "V"), help="a shape instead of the issue's three")
    from depthbench.model.transformer import remat_policy_names

    p.add_argument("--remat", default="matmuls_saveable", choices=remat_policy_names(),
                   metavar="POLICY",
                   help="depthbench's model.remat_policy (default: the micro config's)")
    args = p.parse_args(argv)
    print(run(args.quick, tuple(map(tuple, args.shape)) if args.shape else SHAPES, args.remat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
