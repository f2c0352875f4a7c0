"""``depthbench export-hf RUN_DIR --out DIR``: a run of the baseline family (the
plain LLaMA decoder) as a Hugging Face ``LlamaForCausalLM`` checkpoint (see
:mod:`depthbench.formats.hf`)."""

from __future__ import annotations

import argparse

EPILOG = """\
examples:
  depthbench export-hf runs/pre_ln-L8 --out hf/pre_ln-L8
  python -c "import transformers; transformers.LlamaForCausalLM.from_pretrained('hf/pre_ln-L8')"
  depthbench import-hf hf/pre_ln-L8 --out runs/pre_ln-L8-again    # the same parameters

RUN_DIR is any run directory of the baseline family (trained, imported or
fine-tuned); its newest intact checkpoint is exported.  DIR gets
model.safetensors (fp32), config.json (LlamaConfig) and the run's tokenizer
files.  Other families compute what a Llama does not: export-olmo writes them
in the original DepthBench's format.
"""


def _run(args: argparse.Namespace) -> int:
    from depthbench.formats.hf import export_hf  # late: keeps `depthbench --help` fast

    done = export_hf(args.run_dir, args.out, progress=not args.no_progress)
    print(f"exported {args.run_dir} (step {done['step']}) -> {args.out}: {done['tensors']} "
          f"tensors; {', '.join(done['copied']) or 'no tokenizer files'}")
    return 0


def register_export(subparsers, name: str, *, summary: str, doc: str, epilog: str,
                    out: tuple[str, str], run) -> argparse.ArgumentParser:
    """An export command: ``NAME RUN_DIR --out OUT [--no-progress]`` (``out``: the
    option's metavar and help); export-hf and export-olmo share it."""
    parser = subparsers.add_parser(
        name, help=summary, description=doc.split("\n\n")[0], epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory to export")
    parser.add_argument("--out", required=True, metavar=out[0], help=out[1])
    parser.add_argument("--no-progress", action="store_true", help="no progress output")
    parser.set_defaults(func=run)
    return parser


def register(subparsers) -> None:
    register_export(subparsers, "export-hf",
                    summary="export a run of the plain backbone as a Hugging Face Llama checkpoint",
                    doc=__doc__, epilog=EPILOG,
                    out=("DIR", "new (or empty) folder to write"), run=_run)
