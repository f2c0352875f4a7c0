"""depthbench's train step against the PyTorch peer (transformers' LlamaForCausalLM).

Same shape, batch and work: forward, fp32 cross entropy over the vocabulary,
backward, global-norm clipping and AdamW, fp32, no rematerialisation, compile
excluded.  The two stacks' steps run interleaved (depthbench, torch,
depthbench, torch ...) so machine load hits both alike; the table gives the
median of each and their ratio (goal >= 1.0x).  torch and transformers come
from the optional extra ``depthbench[peer]``; without them this prints why
and skips.

    python -m bench.peer            # the issue's three shapes
    python -m bench.peer --quick    # fewer steps
"""

from __future__ import annotations

import argparse
import sys

from bench import common

# (d_model, depth, seq_len, batch, vocab): the shapes of issue 15.
SHAPES = ((128, 4, 128, 16, 2048), (256, 8, 256, 16, 8192), (768, 12, 512, 4, 32000))


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


def run(quick: bool = False, shapes=SHAPES) -> str:
    """The peer table (or the line saying why it is skipped)."""
    out = [common.header("train step vs PyTorch peer (LlamaForCausalLM), fp32, interleaved")]
    missing = torch_missing()
    if missing:
        return "\n".join([*out, missing])
    import torch

    out[0] += f"; torch {torch.__version__} ({torch.get_num_threads()} threads)"
    reps = 3 if quick else 5
    rows = []
    for d, depth, t, b, v in shapes:
        config = common.config_at(d, depth, t, b, v)
        ours = common.DepthbenchStep(config)
        peer = TorchStep(ours.setup.spec, b, t, float(config.train.lr),
                         float(config.train.clip_norm))
        for _ in range(2):  # compile, then settle the heap: the first steps of each
            ours()           # stack grow it to fit both (page faults the timed steps
            peer()           # would otherwise pay)
        sec = common.interleaved({"depthbench": ours, "torch": peer}, reps)
        rows.append({
            "shape": f"d {d}, L {depth}, T {t}, B {b}, V {v}",
            "depthbench tok/s": ours.tokens / sec["depthbench"],
            "torch tok/s": ours.tokens / sec["torch"],
            "ratio": f"{sec['torch'] / sec['depthbench']:.2f}x",
        })
    out.append(common.table(rows))
    out.append(f"median of {reps} interleaved steps each; ratio = torch step time / depthbench's "
               "(goal >= 1.00x)")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 timed steps instead of 5")
    p.add_argument("--shape", type=int, nargs=5, action="append",
                   metavar=("D", "L", "T", "B", "V"), help="a shape instead of the issue's three")
    args = p.parse_args(argv)
    print(run(args.quick, tuple(map(tuple, args.shape)) if args.shape else SHAPES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
