"""``python -m bench.inference``: what depth costs at serving time, measured.

Per family and depth of one parameter count (the micro suite on a CPU; the
paper-400m suite, L16 .. L70, on an accelerator): time to first token (a
batch's prefill), prefill and decode tokens/s, decode latency per token,
cache bytes per token and the programs' peak memory (XLA's account of the
compiled prefill and decode step); ratios to pre_ln at the same depth and to
the family's shallowest depth.  The families at one depth run interleaved
(each rep generates with every family in turn), and the tables give medians.
Then the issue's goals, each measured side by side in this run: decoding
with the cache against the recompute path (the forward over the whole
bucket per new token, what the evaluators did before) for 128 tokens after
a 512-token prompt, and against transformers' ``LlamaForCausalLM.generate``
with its KV cache at the same shape, fp32, greedy (the ``peer`` extra).

    python -m bench.inference                                 # micro suite, minutes on 2 cores
    python -m bench.inference --families pre_ln,moda --depths 2,10 --batch 4
    python -m bench.inference --suite paper-400m --dtype bfloat16   # an accelerator
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from bench import common

GOAL_PROMPT, GOAL_NEW = 512, 128
DEFAULT_DEPTHS = {"micro": (2, 4, 10), "paper-400m": (16, 20, 24, 28, 32, 42, 70)}
PLOT = common.ROOT / "bench" / "results" / "generate_decode_latency.png"
PAUSE = 0.25  # after torch: its OpenMP threads spin and slow what runs next (common.interleaved)


def load_config(suite: str, family: str, depth: int, window: int, dtype: str):
    """The suite's config of ``family`` (a variant's fields too) at ``depth``,
    its window ``prompt + new`` tokens, weights stored in the compute dtype (as
    served: bf16 weights computed in fp32 would be converted on every step)."""
    from depthbench import config as config_lib
    from depthbench import variants

    entry = variants.expand_entry({"model.family": family})
    args = [f"--config.model.family={entry.pop('model.family')}",
            f"--config.model.depth={depth}", f"--config.train.seq_len={window}",
            f"--config.model.compute_dtype={dtype}", f"--config.model.param_dtype={dtype}",
            *(f"--config.{k}={v}" for k, v in entry.items())]
    return config_lib.load("micro" if suite == "micro" else suite.replace("-", "_"), args)


class Server:
    """A randomly initialised run of ``config`` generating ``new`` tokens after
    each of ``batch`` random prompts of ``prompt`` tokens, greedy, no EOS (every
    row runs its whole budget); its programs compiled by the constructor."""

    def __init__(self, config, prompt: int, new: int, batch: int, seed: int = 0):
        from depthbench.generation.decoder import Decoder
        from depthbench.run import init_run

        self.run = init_run(config, seed)
        self.decoder = Decoder(self.run, window=prompt + new)
        rng = np.random.default_rng(seed)
        self.prompts = rng.integers(1, self.run.spec.vocab_size, (batch, prompt)).tolist()
        self.new = new
        self.once()

    def once(self):
        """One batch generated: its :class:`~depthbench.generation.loop.Timing`."""
        from depthbench.generation.loop import generate

        return generate(self.decoder, self.prompts, max_new=self.new,
                        batch_size=len(self.prompts), progress=False)[1]

    def cache_bytes_per_token(self) -> int:
        """Keys and values of every layer for one token of one sequence."""
        s = self.run.spec
        return 2 * s.depth * s.n_kv_heads * s.head_dim * np.dtype(s.compute_dtype).itemsize

    def peak_bytes(self) -> int:
        return max(common.compiled_memory_bytes(p) for p in self.decoder.programs.values())


def _medians(timings, steps: int) -> dict[str, float]:
    """Medians over reps of one batch each; ``steps``: its decode steps (new - 1)."""
    return {"ttft": statistics.median(t.time_to_first_token for t in timings),
            "prefill": statistics.median(t.prefill_tokens_per_second for t in timings),
            "decode": statistics.median(t.decode_tokens_per_second for t in timings),
            "step": statistics.median(t.decode_seconds / steps for t in timings)}


def families_by_depth(suite: str, families, depths, prompt: int, new: int, batch: int,
                      reps: int, dtype: str) -> list[dict]:
    """One row per (depth, family): the families at a depth measured interleaved."""
    rows = []
    for depth in depths:
        servers = {f: Server(load_config(suite, f, depth, prompt + new, dtype), prompt, new,
                             batch) for f in families}
        timings = {f: [] for f in families}
        for _ in range(reps):
            for f, server in servers.items():
                timings[f].append(server.once())
        for f, server in servers.items():
            m, s = _medians(timings[f], new - 1), server.run.spec
            rows.append({"depth": depth, "AR": s.d_model / s.depth, "family": f,
                         "TTFT ms": 1e3 * m["ttft"], "prefill tok/s": m["prefill"],
                         "decode tok/s": m["decode"], "ms/token": 1e3 * m["step"],
                         "cache KiB/token": server.cache_bytes_per_token() / 1024,
                         "peak MiB": server.peak_bytes() / 2**20})
        del servers
    _ratios(rows)
    return rows


def _ratios(rows: list[dict]) -> None:
    """Each row's decode latency and cache against pre_ln at its depth and against
    its family's shallowest depth (in place)."""
    from depthbench.model.residual.protocol import registry

    base = registry.baseline()
    at = {(r["family"], r["depth"]): r for r in rows}
    first = {}
    for r in rows:
        first.setdefault(r["family"], r)
    for r in rows:
        ref = at.get((base, r["depth"]))
        r["ms/token vs pre_ln"] = f"{r['ms/token'] / ref['ms/token']:.2f}x" if ref else "-"
        r["cache vs pre_ln"] = (f"{r['cache KiB/token'] / ref['cache KiB/token']:.2f}x"
                                if ref else "-")
        low = first[r["family"]]
        r["ms/token vs shallowest"] = f"{r['ms/token'] / low['ms/token']:.2f}x"
        r["cache vs shallowest"] = f"{r['cache KiB/token'] / low['cache KiB/token']:.2f}x"


def plot(rows: list[dict], path) -> None:
    """Decode latency per token against depth, one line per family."""
    from matplotlib.figure import Figure

    from depthbench.plots import save_figure

    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        ax.plot([r["depth"] for r in mine], [r["ms/token"] for r in mine], marker="o",
                label=family)
    ax.set_xlabel("depth L (fixed parameter count: wider when shallower)")
    ax.set_ylabel("decode latency per token (ms)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    save_figure(fig, path)


# ---------------------------------------------------------------- goals
class Recompute:
    """The path before the cache: each new token reruns the jitted forward over
    the whole bucket (``prompt + new`` tokens) and takes the argmax at the last
    real position."""

    def __init__(self, run, prompt: list[int], new: int):
        import jax
        import jax.numpy as jnp

        model = run.model

        def next_token(params, tokens_bt, last):
            logits = model.apply({"params": params}, tokens_bt)[0]
            return jnp.argmax(logits[0, last]).astype(jnp.int32)

        self.fn, self.run = jax.jit(next_token), run
        self.prompt, self.new = prompt, new
        self.once()

    def once(self) -> float:
        """Seconds for the ``new`` tokens."""
        tokens = np.zeros((1, len(self.prompt) + self.new), np.int32)
        tokens[0, :len(self.prompt)] = self.prompt
        t0 = time.perf_counter()
        with self.run.context():
            for at in range(len(self.prompt), len(self.prompt) + self.new):
                tokens[0, at] = int(self.fn(self.run.params, tokens, at - 1))
        return time.perf_counter() - t0


class TorchGenerate:
    """transformers' LlamaForCausalLM at a depthbench spec's shape, fp32, greedy
    ``generate`` with its KV cache; decode seconds = ``t(new) - t(1)``."""

    def __init__(self, spec, prompt: list[int], new: int):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=spec.d_ff,
            num_hidden_layers=spec.depth, num_attention_heads=spec.n_heads,
            num_key_value_heads=spec.n_kv_heads, max_position_embeddings=len(prompt) + new,
            rms_norm_eps=spec.norm_eps, rope_theta=spec.rope_theta, tie_word_embeddings=False,
            attention_bias=False, mlp_bias=False, attn_implementation="sdpa")
        self.torch, self.model = torch, LlamaForCausalLM(cfg).float().eval()
        self.ids, self.new = torch.tensor([prompt]), new
        self.generate(new)

    def generate(self, n: int) -> None:
        with self.torch.no_grad():
            self.model.generate(self.ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                use_cache=True, pad_token_id=0)


def goals(reps: int, dtype: str = "float32") -> list[str]:
    """The issue's two goals on the micro suite's pre_ln (its default depth)."""
    from depthbench.model.residual.protocol import registry

    base = registry.baseline()
    config = load_config("micro", base, 4, GOAL_PROMPT + GOAL_NEW, dtype)
    server = Server(config, GOAL_PROMPT, GOAL_NEW, 1)
    spec = server.run.spec
    shape = (f"micro {base}: d {spec.d_model}, L {spec.depth}, {spec.n_heads} heads, V "
             f"{spec.vocab_size}, {dtype}; prompt {GOAL_PROMPT}, {GOAL_NEW} new tokens, batch 1")
    recompute = Recompute(server.run, server.prompts[0], GOAL_NEW)
    cached, slow = [], []
    for _ in range(reps):  # interleaved
        cached.append(server.once())
        slow.append(recompute.once())
    m = _medians(cached, GOAL_NEW - 1)
    end_to_end = GOAL_NEW / statistics.median(t.prefill_seconds + t.decode_seconds
                                               for t in cached)
    recompute_tps = GOAL_NEW / statistics.median(slow)
    rows = [{"path": "KV cache: decode steps", "tok/s": m["decode"],
             "vs recompute": f"{m['decode'] / recompute_tps:.1f}x"},
            {"path": "KV cache: prefill + decode", "tok/s": end_to_end,
             "vs recompute": f"{end_to_end / recompute_tps:.1f}x"},
            {"path": "recompute (forward over the bucket per token)", "tok/s": recompute_tps,
             "vs recompute": "1.0x"}]
    ratio = m["decode"] / recompute_tps
    out = [f"goal 1: decode with the cache >= 5x the recompute path's tokens/s ({shape})",
           common.table(rows),
           f"{'MET' if ratio >= 5 else 'NOT MET'}: {ratio:.1f}x (decode steps; "
           f"{end_to_end / recompute_tps:.1f}x counting the prefill too)", ""]
    from bench.peer import torch_missing

    missing = torch_missing()
    if missing:
        return [*out, f"goal 2: {missing}"]
    import torch

    peer = TorchGenerate(spec, server.prompts[0], GOAL_NEW)
    ours, full, first = [], [], []
    for _ in range(reps):  # interleaved, torch's threads let settle before each
        ours.append(server.once())
        for n, into in ((GOAL_NEW, full), (1, first)):
            time.sleep(PAUSE)
            t0 = time.perf_counter()
            peer.generate(n)
            into.append(time.perf_counter() - t0)
        time.sleep(PAUSE)
    peer_tps = (GOAL_NEW - 1) / (statistics.median(full) - statistics.median(first))
    ours_tps = _medians(ours, GOAL_NEW - 1)["decode"]
    rows = [{"stack": "depthbench (jit, KV cache)", "decode tok/s": ours_tps},
            {"stack": f"transformers generate (torch {torch.__version__}, "
                      f"{torch.get_num_threads()} threads)", "decode tok/s": peer_tps}]
    ratio = ours_tps / peer_tps
    return [*out, f"goal 2: depthbench's decode >= 1.0x transformers' "
                  f"LlamaForCausalLM.generate with its KV cache ({shape})",
            common.table(rows),
            f"{'MET' if ratio >= 1 else 'NOT MET'}: {ratio:.2f}x (transformers' decode = "
            f"(t({GOAL_NEW} tokens) - t(1 token)) / {GOAL_NEW - 1}, medians of {reps})"]


# ---------------------------------------------------------------- bench.accelerator
ACCELERATOR_TABLE = "decode latency and KV cache against depth at a fixed parameter count"


def accelerator_part(part) -> None:
    """``python -m bench.accelerator``'s ``inference`` part: pre_ln on the
    paper-400m suite from AR 76 (L16) to AR 9 (L70), bf16, prompt 512, 64 new
    tokens, batch 8, a row per depth as soon as it is measured; ``--dry``: the
    micro suite's L2 and L10, pre_ln and moda, tiny lengths."""
    if part.dry:
        suite, families, depths, lengths, reps, dtype = (
            "micro", ("pre_ln", "moda"), (2, 10), (16, 4, 2), 1, "float32")
    else:
        suite, families, depths, lengths, reps, dtype = (
            "paper-400m", ("pre_ln",), DEFAULT_DEPTHS["paper-400m"], (512, 64, 8), 3, "bfloat16")
    prompt, new, batch = lengths
    part.note(f"{suite} suite, {dtype}: prompt {prompt}, {new} new tokens, batch {batch}, "
              f"greedy; medians of {reps}; the families at a depth interleaved")
    done: list[dict] = []

    def measure(depth: int) -> list[dict]:
        rows = families_by_depth(suite, families, [depth], prompt, new, batch, reps, dtype)
        done.extend(rows)
        _ratios(done)  # against pre_ln at the depth and the family's shallowest so far
        return [{k: v for k, v in r.items() if k != "depth"} for r in rows]

    for depth in depths:
        part.guarded(ACCELERATOR_TABLE, {"depth": depth}, lambda d=depth: measure(d))


# ---------------------------------------------------------------- entry
def run(suite: str = "micro", families=None, depths=None, prompt: int = 128, new: int = 32,
        batch: int = 1, reps: int = 3, dtype: str = "float32", with_goals: bool = True,
        plot_path=PLOT) -> str:
    from depthbench.model.residual.protocol import registry

    families = list(families or registry.names())
    depths = list(depths or DEFAULT_DEPTHS[suite])
    out = [common.header(f"inference per family and depth, {suite} suite, {dtype}: prompt "
                         f"{prompt}, {new} new tokens, batch {batch}, greedy; medians of "
                         f"{reps} interleaved")]
    rows = families_by_depth(suite, families, depths, prompt, new, batch, reps, dtype)
    out += [common.table(rows),
            "TTFT: a batch's prefill, dispatch to first token on the host; decode tok/s: "
            "tokens of every row per second of decode steps; ms/token: one decode step; "
            "cache: keys and values of every layer per token; peak: XLA's account of the "
            "larger compiled program (prefill or step), arguments + outputs + temporaries."]
    if plot_path:
        plot(rows, plot_path)
        out.append(f"(decode latency per token against depth: {plot_path})")
    if with_goals:
        out += ["", *goals(reps)]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.inference",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="micro", choices=sorted(DEFAULT_DEPTHS))
    p.add_argument("--families", default="", help="comma-separated (default: every family)")
    p.add_argument("--depths", default="", help="comma-separated depths of the suite "
                   "(default: micro 2,4,10; paper-400m all)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (128)")
    p.add_argument("--new", type=int, default=32, help="new tokens per prompt (32)")
    p.add_argument("--batch", type=int, default=1, help="prompts per batch (1)")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions (3)")
    p.add_argument("--dtype", default="float32", help="compute dtype (float32)")
    p.add_argument("--no-goals", action="store_true", help="skip the two goals")
    p.add_argument("--plot", default=str(PLOT), help="the latency plot (PNG); '' for none")
    args = p.parse_args(argv)
    print(run(args.suite, [f for f in args.families.split(",") if f],
              [int(d) for d in args.depths.split(",") if d], args.prompt, args.new, args.batch,
              args.reps, args.dtype, not args.no_goals, args.plot), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
