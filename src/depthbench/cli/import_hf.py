"""``depthbench import-hf PATH --out RUN_DIR``: a local Hugging Face Llama
checkpoint as a pre_ln run directory (see :mod:`depthbench.formats.hf`)."""

from __future__ import annotations

import argparse

EPILOG = """\
examples:
  depthbench import-hf ~/models/TinyLlama-1.1B --out runs/tinyllama
  depthbench analyze runs/tinyllama
  lm_eval --model depthbench --model_args run=runs/tinyllama --tasks arc_easy

PATH is a local directory (config.json + *.safetensors; the hub is never
contacted).  Supported: LlamaForCausalLM without rope scaling (GQA, tied or
untied embeddings, any rope_theta and rms_norm_eps).  tokenizer.json and its
companions are copied into RUN_DIR.
"""


def _run(args: argparse.Namespace) -> int:
    from depthbench.formats.hf import import_hf  # late: keeps `depthbench --help` fast

    written = import_hf(args.path, args.out, progress=not args.no_progress)
    shape, hf = written["resolved"]["shape"], written["resolved"]["hf"]
    print(f"imported {args.path} -> {args.out}: {written['model']['family']}, depth "
          f"{shape['depth']}, d_model "
          f"{shape['d_model']}, heads {shape['n_heads']}/{shape['n_kv_heads']} kv, "
          f"{written['resolved']['params']:,} parameters"
          f"{' (tied embeddings copied to head)' if hf['tie_word_embeddings'] else ''}; "
          f"copied {', '.join(hf['copied']) or 'no tokenizer files'}")
    return 0


def register_import(subparsers, name: str, *, summary: str, doc: str, epilog: str,
                    source: tuple[str, str, str], run) -> argparse.ArgumentParser:
    """An import command: ``NAME SOURCE --out RUN_DIR [--no-progress]`` (``source``:
    its argument's dest, metavar and help); import-hf and import-olmo share it.
    Returns the parser (for a command's own options)."""
    parser = subparsers.add_parser(
        name, help=summary, description=doc.split("\n\n")[0], epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    dest, metavar, help_text = source
    parser.add_argument(dest, metavar=metavar, help=help_text)
    parser.add_argument("--out", required=True, metavar="RUN_DIR",
                        help="new (or empty) run directory to write")
    parser.add_argument("--no-progress", action="store_true", help="no progress output")
    parser.set_defaults(func=run)
    return parser


def register(subparsers) -> None:
    register_import(subparsers, "import-hf",
                    summary="import a local Hugging Face Llama checkpoint as a plain-backbone run",
                    doc=__doc__, epilog=EPILOG,
                    source=("path", "PATH", "local checkpoint directory"), run=_run)
