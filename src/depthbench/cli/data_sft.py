"""``depthbench data sft RECORDS --run RUN_DIR``: instruction records as token ids and label
masks for fine-tuning (see :mod:`depthbench.finetune.records`)."""

from __future__ import annotations

import argparse
import json

_EPILOG = """\
examples:
  depthbench data sft commonsense_170k.json --run runs/preln-L24
  depthbench data sft alpaca_data.json --run runs/demo --max-seq-len 256 --max-samples 2000
  depthbench data sft records.parquet --run runs/demo --json

RECORDS is a local .json (a list of records, or one per line), .jsonl/.ndjson or
.parquet file whose records name instruction, input (optional) and output, as
Commonsense170K and Alpaca do.  Each is rendered with the original DepthBench's
Alpaca template (eval/finetune/prepare_commonsense170k.py) and tokenised with
RUN_DIR's tokenizer; the loss will cover the response and its EOS only.  A record
longer than --max-seq-len keeps its first max_seq_len - 1 tokens and EOS (the
original's rule; one cut before its response is refused).  The records are
shuffled with --seed and --val-fraction of them held out.  The result is cached
(DEPTHBENCH_CACHE) under a digest of the inputs; the command prints its folder.
`depthbench finetune RUN_DIR --records RECORDS --workdir DIR` trains on the same
entry (it prepares it when absent; docs/FINETUNE.md).
"""


def register(sub) -> None:
    """Add the ``sft`` action to ``depthbench data``'s sub-parsers."""
    from depthbench.cli.validators import non_negative_int, positive_int

    p = sub.add_parser(
        "sft", help="instruction records -> token ids and label masks for fine-tuning (cached)",
        description="Render instruction records with the original's template, tokenise them "
        "with a run's tokenizer and keep a label mask over each response (cached).",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", metavar="RECORDS", help="local .json, .jsonl or .parquet records")
    p.add_argument("--run", required=True, metavar="RUN_DIR",
                   help="the run to fine-tune: its tokenizer encodes the records")
    p.add_argument("--max-seq-len", type=positive_int, default=512, metavar="N",
                   help="longest record in tokens (default 512, the original's)")
    p.add_argument("--max-samples", type=positive_int, default=None, metavar="N",
                   help="keep N records after shuffling (default: all)")
    p.add_argument("--val-fraction", type=float, default=0.02, metavar="F",
                   help="share of records held out for validation (default 0.02, at least 1)")
    p.add_argument("--seed", type=non_negative_int, default=42,
                   help="shuffle seed (default 42, the original's)")
    p.add_argument("--json", action="store_true", help="print manifest.json instead of a summary")
    p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    p.set_defaults(func=_sft)


def _sft(args: argparse.Namespace) -> int:
    from depthbench.finetune.records import prepare_sft  # late: keeps --help fast

    data = prepare_sft(args.records, args.run, max_seq_len=args.max_seq_len,
                       max_samples=args.max_samples, val_fraction=args.val_fraction,
                       seed=args.seed, progress=not args.quiet)
    if args.json:
        print(json.dumps({**data.manifest, "directory": str(data.directory)}, indent=2))
        return 0
    print(f"{data.directory}  (digest {data.digest})")
    for name, s in data.manifest["splits"].items():
        print(f"  {name:5} {s['records']:>8,} records  {s['tokens']:>10,} tokens  "
              f"{s['supervised_tokens']:>9,} supervised  {s['truncated']:,} truncated  "
              f"longest {s['longest']}")
    return 0
