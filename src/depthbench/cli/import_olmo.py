"""``depthbench import-olmo STEP_DIR --out RUN_DIR``: a checkpoint the original
DepthBench released (OLMo-core distributed checkpoint) as a run directory of the
family it trained (see :mod:`depthbench.formats.olmo.step_dir`)."""

from __future__ import annotations

import argparse

from depthbench.cli.import_hf import register_import

EPILOG = """\
examples:
  depthbench import-olmo ckpt/preln-400M-L24/step7600 --out runs/preln-L24 \
      --val-tokens data/fineweb-edu-eval/eval_00000.npy
  depthbench analyze runs/preln-L24
  depthbench eval runs/preln-L24 --suite commonsense

STEP_DIR is a local step directory of an original DepthBench run (config.json,
model_and_optim/.metadata and *.distcp; the hub is never contacted), or a
repository root holding the final checkpoint.  The tokenizer files of
STEP_DIR/tokenizer/ or STEP_DIR/../tokenizer/ are copied into RUN_DIR.
Optimizer state is not read; the weights are stored in fp32 (a leaf the
family keeps in bf16, as stored).  hc and PyTorch mHC were trained in two
forms by the original (docs/ORIGINAL.md); the import tells them apart from
config.json's fields, prints its choice where those cannot, and
--hc-form picks one.  --val-tokens names a 1-D token .npy (the
original's held-out shard, tokenised: docs/REPRODUCE.md) that `depthbench
analyze` reads as the run's validation split.  Needs neither torch nor
olmo_core: the checkpoint's pickles are read with an allow-list of torch's
checkpoint classes, and nothing they name is run.  Every choice the original
made is a field of the run's family; what a field cannot carry (a depth-width
run's training rules) is said (resolved.olmo.departures in RUN_DIR/config.json).
"""


def _options(args: argparse.Namespace) -> dict[str, str]:
    from depthbench.formats.olmo.config import import_options

    return {name: getattr(args, name) for name in import_options()}


def _run(args: argparse.Namespace) -> int:
    from depthbench.formats.olmo.step_dir import import_olmo  # late: keeps `depthbench --help` fast

    written = import_olmo(args.step_dir, args.out, progress=not args.no_progress,
                          val_tokens=args.val_tokens, **_options(args))
    resolved = written["resolved"]
    shape, olmo = resolved["shape"], resolved["olmo"]
    print(f"imported {args.step_dir} -> {args.out}: {written['model']['family']} (original "
          f"block {olmo['block']!r}, step {olmo['step']}), depth {shape['depth']}, d_model "
          f"{shape['d_model']}, heads {shape['n_heads']}/{shape['n_kv_heads']} kv, "
          f"{resolved['params']:,} parameters; copied "
          f"{', '.join(olmo['copied']) or 'no tokenizer files'}")
    if resolved["tokenizer"]["val_tokens_path"]:
        print(f"  validation split: {resolved['tokenizer']['val_tokens_path']} "
              f"({resolved['tokenizer']['val_tokens']:,} tokens)")
    form = olmo.get("form")
    if form and not form["certain"]:
        other = "early" if form["form"] == "final" else "final"
        flag = "--" + form["option"].replace("_", "-")
        print(f"  {written['model']['family']} form: {form['form']} ({form['why']}); "
              f"{flag} {other} imports the {other} form")
    for note in olmo["departures"]:
        print(f"  differs from the original: {note}")
    return 0


def register(subparsers) -> None:
    parser = register_import(
        subparsers, "import-olmo",
        summary="import a checkpoint the original DepthBench released (OLMo-core)",
        doc=__doc__, epilog=EPILOG,
        source=("step_dir", "STEP_DIR", "local step directory"), run=_run)
    parser.add_argument("--val-tokens", metavar="FILE",
                        help="token .npy recorded as the run's validation split (analyze)")
    from depthbench.formats.olmo.config import import_options

    for name, (choices, default, text) in import_options().items():  # the families' own
        parser.add_argument("--" + name.replace("_", "-"), dest=name, choices=choices,
                            default=default, help=text)
