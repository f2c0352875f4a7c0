"""``depthbench data tokenize``: text, JSON-lines or Parquet files -> token shards (parallel)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_EPILOG = """\
examples:
  depthbench data tokenize --input '/data/fineweb-edu/sample/10BT/*.parquet' \\
      --tokenizer /data/gpt-neox-20b/tokenizer.json --out /data/fineweb_edu_neox --workers 16
  depthbench data tokenize --input 'books/*.jsonl' --text-field body \\
      --tokenizer spm.model --out /tmp/books-tokens --shard-tokens 10000000

The shards are what `--config.data.corpus=tokens` reads: train on them with
  --config.data.paths='OUT/*.npy' --config.data.eos_id=EOS --config.data.val_fraction=F
  --config.data.tokenizer=TOKENIZER
(EOS and F as manifest.json records them; the tokenizer only decodes: `data show`,
analyses and evaluation).  Killed?  Re-run the same command:
finished inputs are kept.  See docs/DATA.md.
"""


def register(sub) -> None:
    """Add the ``tokenize`` action to ``depthbench data``'s sub-parsers."""
    p = sub.add_parser(
        "tokenize",
        help="tokenise large text/JSON-lines/Parquet corpora into token shards (parallel)",
        description="Tokenise files into fixed-size .npy token shards (documents followed by "
        "the tokenizer's EOS) plus manifest.json, streaming, in parallel and resumably. "
        "The output is identical for any number of workers.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--input", required=True, metavar="GLOB",
                   help="comma-separated files or globs: .parquet, .jsonl/.json/.ndjson[.gz], "
                        ".txt/.text/.md[.gz] (a text file is one document)")
    p.add_argument("--text-field", default="text", metavar="F",
                   help="the JSON field or Parquet column holding each document (default text)")
    p.add_argument("--tokenizer", required=True, metavar="FILE",
                   help="a Hugging Face tokenizer.json or a SentencePiece .model")
    p.add_argument("--eos-token", default="", metavar="TOKEN",
                   help="tokenizer.json only: the EOS token (default: the first of "
                        "<|endoftext|>, </s>, <|end_of_text|>, <eos>, <|eot_id|> it has)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (new or empty, "
                   "or a killed run's, to resume it)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="worker processes, one core each (default 1)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, metavar="K",
                   help="tokens per shard (default 100,000,000: 200 MB of uint16)")
    p.add_argument("--val-fraction", type=float, default=0.001, metavar="F",
                   help="share of documents held out for validation, by a hash of their "
                        "tokens (default 0.001, the paper specs' data.val_fraction)")
    p.add_argument("--dtype", default="auto", choices=("auto", "uint16", "uint32"),
                   help="shard dtype (default auto: uint16 if the vocabulary fits)")
    p.add_argument("--json", action="store_true", help="print manifest.json instead of a summary")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.set_defaults(func=_tokenize)


def _tokenize(args) -> int:
    from depthbench.data import tokenize

    def log(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    opts = tokenize.Options(text_field=args.text_field, shard_tokens=args.shard_tokens,
                            val_fraction=args.val_fraction, dtype=args.dtype,
                            eos_token=args.eos_token)
    manifest = tokenize.run(args.input, args.tokenizer, args.out, opts, workers=args.workers,
                            progress=not args.quiet, log=log)
    if args.json:
        print(json.dumps(manifest, indent=1))
        return 0
    for name, s in manifest["splits"].items():
        print(f"{name:<5}  {s['documents']:>12,} documents  {s['tokens']:>15,} tokens  "
              f"{len(s['shards']):>5} shard(s)")
    print(f"train with: --config.data.corpus=tokens --config.data.paths='{args.out}/*.npy' "
          f"--config.data.tokens_dtype={manifest['dtype']} "
          f"--config.data.eos_id={manifest['eos_id']} "
          f"--config.data.val_fraction={manifest['val_fraction']} "
          f"--config.data.tokenizer={Path(args.tokenizer).resolve()}")
    return 0
