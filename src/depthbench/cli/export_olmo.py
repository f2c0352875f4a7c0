"""``depthbench export-olmo RUN_DIR --out STEP_DIR``: a run of a family the original
DepthBench trained as a checkpoint in its release format (OLMo-core's
config.json and distributed checkpoint; see :mod:`depthbench.formats.olmo.step_dir`)."""

from __future__ import annotations

import argparse

from depthbench.cli.export_hf import register_export

EPILOG = """\
examples:
  depthbench export-olmo runs/hc-L24 --out ckpt/hc-L24/step7600
  depthbench import-olmo ckpt/hc-L24/step7600 --out runs/hc-L24-again   # the same logits

STEP_DIR gets config.json (the OLMo-core experiment config: the model's
TransformerConfig with the family's block config, the tokenizer's ids, the
run's AdamW settings), model_and_optim/ (.metadata and __0_0.distcp, written by
torch.distributed.checkpoint; model tensors only, no optimizer state) and
tokenizer/ (the run's tokenizer files).  Upstream OLMo-core builds and loads it
for the designs it has blocks for (pre_ln, lns, sandwich_ln).  Needs torch
(pip install torch); a family the original never trained, or a configuration
of one it has no block for, is one line.
"""


def _run(args: argparse.Namespace) -> int:
    from depthbench.formats.olmo.step_dir import export_olmo  # late: keeps `depthbench --help` fast

    done = export_olmo(args.run_dir, args.out, progress=not args.no_progress)
    print(f"exported {args.run_dir} (step {done['step']}) -> {args.out}: {done['family']} as "
          f"the original's {done['block']!r} block, {done['tensors']} tensors; "
          f"{', '.join(done['copied']) or 'no tokenizer files'}")
    return 0


def register(subparsers) -> None:
    register_export(subparsers, "export-olmo",
                    summary="export a run in the original DepthBench's format (OLMo-core)",
                    doc=__doc__, epilog=EPILOG,
                    out=("STEP_DIR", "new (or empty) step directory to write"), run=_run)
