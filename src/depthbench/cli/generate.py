"""``depthbench generate RUN_DIR --prompt TEXT | --prompts FILE.jsonl``: text from a
run, decoded with a KV cache."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

DEFAULT_NEW_TOKENS = 64

EPILOG = """\
examples:
  depthbench generate runs/demo --prompt "Once upon a time" --max-new-tokens 40
  depthbench generate runs/demo --prompt "The" --temperature 0.8 --top-p 0.9 --seed 1
  depthbench generate runs/tinyllama --prompts questions.jsonl --field question \\
      --max-new-tokens 128 --stop "\\n\\n" --batch-size 16 --out answers.jsonl

Greedy by default (--temperature 0); sampling is deterministic for a --seed,
whatever the batch size.  Each prompt follows the tokenizer's document start
(BOS where a Hugging Face tokenizer has one, else EOS: depthbench runs train
on documents joined by EOS).  A completion ends at EOS, before a --stop
string, after --max-new-tokens, or when prompt and completion fill the run's
window (train.seq_len).  --out FILE.jsonl: each prompt's record with
"completion", "new_tokens" and "stop_reason" added.  The run's latest intact
checkpoint is read (a damaged one is skipped with a warning).
"""


class Prompt(NamedTuple):
    record: dict  # what the output line repeats (the file's record, or {"prompt": TEXT})
    text: str
    where: str  # how an error names it: "--prompt", "--prompts: 'FILE' line N"


def read_prompts(args: argparse.Namespace) -> list[Prompt]:
    """``--prompt TEXT``, or ``record[--field]`` of each line of ``--prompts`` (JSON
    Lines read as the instruction records are:
    :func:`depthbench.finetune.records.json_lines`), checked before any model is
    loaded: each problem one line naming the option, the file and the line."""
    from depthbench.errors import ConfigError
    from depthbench.finetune.records import json_lines, unicode_text

    if args.prompt is not None:
        if not args.prompt:
            raise ConfigError("--prompt: empty; give the text to continue")
        return [Prompt({"prompt": args.prompt}, unicode_text(args.prompt, "--prompt"),
                       "--prompt")]
    path, field = args.prompts, args.field
    file = Path(path).expanduser()
    if not file.is_file():
        what = "is a directory" if file.is_dir() else "does not exist"
        raise ConfigError(f"--prompts: {path!r} {what}; give a JSON-lines file")
    try:
        content = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"--prompts: {path!r} is not UTF-8 text (JSON lines)") from None
    out = []
    for number, record in json_lines(content, lambda n: f"--prompts: {path!r} line {n}"):
        where = f"--prompts: {path!r} line {number}"
        if not isinstance(record, dict):
            raise ConfigError(f"{where} holds a JSON {type(record).__name__}, not an object "
                              f"with a {field!r} field")
        if field not in record:
            raise ConfigError(f"{where} has no field {field!r} (--field names the prompt's "
                              f"field; the record has {', '.join(map(repr, record)) or 'none'})")
        text = record[field]
        if not isinstance(text, str):
            raise ConfigError(f"{where}: field {field!r} is a {type(text).__name__}, not text")
        if not text:
            raise ConfigError(f"{where}: the prompt ({field!r}) is empty")
        out.append(Prompt(record, unicode_text(text, f"{where}: the prompt ({field!r})"), where))
    if not out:
        raise ConfigError(f"--prompts: {path!r} holds no prompts")
    return out


def _run(args: argparse.Namespace) -> int:
    from depthbench import faults
    from depthbench.errors import ConfigError
    from depthbench.output_paths import out_storage_error, output_file

    # Everything that can be checked without the model first: nothing is loaded
    # (and nothing written) for a bad prompts file or --out.
    prompts = read_prompts(args)
    out = output_file(args.out, "--out") if args.out else None

    from depthbench.evaluation.prefix import prefix_token_id
    from depthbench.generation.decoder import Decoder
    from depthbench.generation.loop import generate
    from depthbench.generation.sampling import Sampling
    from depthbench.run import load_run
    from depthbench.rundir.io import write_jsonl

    run = load_run(args.run_dir, step=args.step)
    tok, window = run.tokenizer, int(run.config.train.seq_len)
    max_new = args.max_new_tokens or min(DEFAULT_NEW_TOKENS, window)
    if max_new > window:
        raise ConfigError(f"--max-new-tokens: {max_new} is past the run's window of {window} "
                          "tokens (train.seq_len)")
    ids = []
    for p in prompts:
        tokens = [prefix_token_id(tok), *tok.encode(p.text)]
        if len(tokens) > window:
            raise ConfigError(f"{p.where}: {len(tokens)} tokens (with the document start) are "
                              f"longer than the run's window of {window} (train.seq_len)")
        ids.append(tokens)
    decoder = Decoder(run, Sampling(args.temperature, args.top_k, args.top_p), window=window)
    completions, timing = generate(
        decoder, ids, max_new=max_new, batch_size=args.batch_size, seed=args.seed,
        stop=args.stop or (), eos_id=tok.eos_id if tok.eos_id >= 0 else None,
        detokenize=lambda new: tok.decode(new, skip_special_tokens=True),
        progress=not args.no_progress)
    if out is not None:
        rows = [{**p.record, "completion": c.text, "new_tokens": len(c.ids),
                 "stop_reason": c.stop_reason} for p, c in zip(prompts, completions, strict=True)]
        try:
            write_jsonl(out, rows)  # replaced whole or not at all
        except OSError as e:  # a full or read-only disk: one line naming --out, exit 4
            if not faults.is_storage_error(e):
                raise
            raise out_storage_error(e, out, "generate") from e
        print(f"wrote {out} ({len(completions)} completions)")
    else:
        for p, c in zip(prompts, completions, strict=True):
            print(f"{p.text}{c.text}\n[{len(c.ids)} tokens, {c.stop_reason}]\n")
    print(timing.summary())
    return 0


def register(subparsers) -> None:
    from depthbench.cli.validators import (
        non_negative_float,
        non_negative_int,
        positive_int,
        seed,
        unit_fraction,
    )

    p = subparsers.add_parser(
        "generate", help="generate text from a run (KV cache; greedy or sampled)",
        description=__doc__.split("\n\n")[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (trained or imported)")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", metavar="TEXT", help="one prompt")
    given.add_argument("--prompts", metavar="FILE.jsonl",
                       help="JSON lines, one record per prompt (its text in --field)")
    p.add_argument("--field", default="prompt", help="the prompt's field in --prompts (prompt)")
    p.add_argument("--max-new-tokens", type=positive_int,
                   help=f"tokens to generate per prompt, at most ({DEFAULT_NEW_TOKENS}, or the "
                        "run's window if shorter)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0,
                   help="0: greedy (default); above 0: sample from softmax(logits / T) "
                        "(below float32's smallest normal, 1.2e-38: greedy, its limit)")
    p.add_argument("--top-k", type=non_negative_int, default=0,
                   help="sample from the k most likely tokens only (0: all)")
    p.add_argument("--top-p", type=unit_fraction, default=1.0,
                   help="sample from the smallest set of tokens holding this much probability "
                        "(1: all)")
    p.add_argument("--seed", type=seed, default=0, help="sampling seed, 0 to 2**32 - 1 (0)")
    p.add_argument("--batch-size", type=positive_int, default=8,
                   help="prompts decoded together (8)")
    p.add_argument("--stop", action="append", metavar="TEXT",
                   help="end a completion before this text (repeatable)")
    p.add_argument("--out", metavar="FILE.jsonl", help="write the completions here instead")
    p.add_argument("--step", type=non_negative_int, help="checkpoint step (default: latest)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
