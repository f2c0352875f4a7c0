"""``depthbench data prepare | show | tokenize | sft``: build, look at and pre-tokenise
corpora; instruction records for fine-tuning."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from depthbench import configs, data
from depthbench.cli import data_sft, data_tokenize
from depthbench.errors import ConfigError

MAX_SHOW_WINDOWS = 1000

_EPILOG_PREPARE = """\
examples:
  depthbench data prepare --config experiments/base.py
  depthbench data prepare --config experiments/base.py \\
      --config.data.corpus=text --config.data.paths='books/*.txt' --config.data.split_by=paragraph
  depthbench data prepare --config experiments/base.py --json
"""

_EPILOG_SHOW = """\
examples:
  depthbench data show --config experiments/base.py
  depthbench data show --config experiments/base.py --split val --windows 2
"""


_EPILOG_DATA = """\
examples:
  depthbench data prepare --config experiments/base.py
  depthbench data show --config experiments/base.py --split val --windows 2
  depthbench data prepare --config experiments/micro.py \\
      --config.data.corpus=text --config.data.paths='docs/**/*.md' \\
      --config.data.split_by=paragraph --config.data.val_fraction=0.3

`depthbench data ACTION --help` shows each action's options and more examples.
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "data",
        help="prepare the corpus (fetch, split, tokenizer, tokens) and show windows",
        description="Prepare and inspect the training data (see docs/DATA.md).",
        epilog=_EPILOG_DATA,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="data_command", metavar="ACTION", required=True, parser_class=type(parser)
    )
    prep = sub.add_parser(
        "prepare",
        help="fetch, split, train the tokenizer and tokenise (cached)",
        description="Fetch the corpus, hold out the validation split, train (or load) the "
        "tokenizer and tokenise both splits into the cache. Re-running reuses it.",
        epilog=_EPILOG_PREPARE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show = sub.add_parser(
        "show",
        help="print a few decoded windows, as the model sees them",
        description="Print decoded windows of the prepared corpus (preparing it if needed).",
        epilog=_EPILOG_SHOW,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for p in (prep, show):
        p.add_argument(
            "--config",
            default=str(configs.file_of("base")),
            metavar="SPEC",
            help="experiment spec file (default: experiments/base.py); fields can be "
            "overridden with --config.section.field=value",
        )
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.add_argument("--quiet", action="store_true", help="no progress output on stderr")
        p.set_defaults(accepts_overrides=True)
    prep.set_defaults(func=_prepare)
    show.add_argument(
        "--split",
        choices=("train", "val"),
        default="train",
        help="training windows (the first batch, shuffled) or validation windows",
    )
    show.add_argument("--windows", type=int, default=3, metavar="N",
                      help=f"windows to print (1 to {MAX_SHOW_WINDOWS})")
    show.set_defaults(func=_show)
    data_tokenize.register(sub)
    data_sft.register(sub)


def _load(args):
    from depthbench import config as config_lib

    config = config_lib.load(args.config, args.overrides)
    t0 = time.perf_counter()
    prepared = data.prepare(config, progress=not args.quiet)
    return config, prepared, time.perf_counter() - t0


def _table(rows: list[list[str]]) -> str:
    """Columns aligned: the first to the left, numbers to the right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _prepare(args) -> int:
    config, p, seconds = _load(args)
    seq_len = config.train.seq_len
    if args.json:
        print(
            json.dumps(
                {
                    **p.as_dict(),
                    "seconds": round(seconds, 3),
                    "seq_len": seq_len,
                    "train_windows_available": data.window_count(p.train_tokens, seq_len),
                    "val_windows_available": data.window_count(p.val_tokens, seq_len),
                },
                indent=2,
            )
        )
        return 0
    for key, value in (
        ("corpus", p.corpus),
        ("tokenizer", p.tokenizer_path or "(none)"),
        ("ids", f"vocab {p.vocab_size}, bos {p.bos_id}, eos {p.eos_id}, pad {p.pad_id}"),
        ("tokens", f"{Path(p.train_tokens_path).parent}/{{train,val}}.npy ({p.token_dtype})"),
    ):
        print(f"{key:<10} {value}")
    print()
    rows = [["split", "documents", "tokens", "MB (UTF-8)", "bytes/token", f"windows (T={seq_len})"]]
    for name, docs, toks, nbytes in (
        ("train", p.train_documents, p.train_tokens, p.train_bytes),
        ("val", p.val_documents, p.val_tokens, p.val_bytes),
    ):
        bpt = nbytes / max(1, toks - docs) if nbytes else p.bytes_per_token
        rows.append(
            [
                name,
                f"{docs:,}",
                f"{toks:,}",
                f"{nbytes / 1e6:.2f}" if nbytes else "-",
                f"{bpt:.3f}" if bpt else "-",
                f"{data.window_count(toks, seq_len):,}",
            ]
        )
    print(_table(rows))
    print()
    print(f"prepared in {seconds:.1f}s (cached steps are reused)")
    return 0


def _render(p, tok, ids: list[int]) -> str:
    """Decoded text with document ends marked (token ids if there is no tokenizer)."""
    if tok is None:
        return " ".join(map(str, ids))
    segments, current = [], []
    for i in ids:
        if i == p.eos_id:
            segments.append(current)
            current = []
        else:
            current.append(i)
    segments.append(current)
    return "\n<|eos|>\n".join(tok.decode(s) for s in segments)


def _show(args) -> int:
    # Checked before preparing anything: the windows are held and decoded in memory.
    if not 1 <= args.windows <= MAX_SHOW_WINDOWS:
        raise ConfigError(
            f"--windows: must be in [1, {MAX_SHOW_WINDOWS}], got {args.windows} (data show is "
            "for looking; read more tokens from the arrays data prepare --json names)")
    config, p, _ = _load(args)
    if args.split == "train":
        rows = []
        it = data.train_iterator(config, p, process_index=0, process_count=1)
        while len(rows) < args.windows:
            rows.extend(next(it)["inputs"])
    else:
        rows = [
            r
            for b in data.val_batches(config, p, process_index=0, process_count=1)
            for r in b["inputs"]
        ]
    rows = rows[: args.windows]
    tok = data.tokenizer(p) if p.tokenizer_path else None
    texts = [_render(p, tok, r.tolist()) for r in rows]
    if args.json:
        print(
            json.dumps(
                [
                    {"split": args.split, "tokens": r.tolist(), "text": t}
                    for r, t in zip(rows, texts, strict=True)
                ],
                indent=2,
                ensure_ascii=False,
            )
        )
        return 0
    for i, text in enumerate(texts):
        print(f"--- {args.split} window {i} ({len(rows[i])} tokens) ---")
        print(text)
        print()
    return 0
