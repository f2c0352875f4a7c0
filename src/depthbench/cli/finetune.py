"""``depthbench finetune PARENT_RUN --records FILE --workdir DIR``: supervised
fine-tuning of a run, the original DepthBench's recipe, into a new run directory."""

from __future__ import annotations

import argparse

from depthbench.cli.validators import directory

_EPILOG = """\
examples:
  depthbench finetune runs/preln-L24 --records commonsense_170k.json --workdir runs/preln-L24-sft
  depthbench finetune runs/imported --records alpaca_data.json --workdir runs/imported-sft \\
      --config.finetune.layout=packed --config.finetune.max_samples=20000
  depthbench finetune runs/demo --records my_records.jsonl --workdir runs/demo-sft \\
      --config.train.batch_size=16 --config.train.seq_len=256 \\
      --config.finetune.max_seq_len=257 --config.model.compute_dtype=float32

PARENT_RUN is any run directory (train, import-hf, import-olmo; any family): its
newest intact checkpoint's parameters are the start (a damaged latest one is
skipped with a warning), its tokenizer encodes the records (as `depthbench data
sft` does, through the same cache).  The default spec, sft, is the original's
recipe: AdamW lr 1e-4, weight decay 0.1, betas (0.9, 0.95), eps 1e-8, 3% warmup
then linear decay to 0, 3 epochs (finetune.epochs sets train.steps; a
--config.train.steps=N given cuts the run short: a smoke test), 128
sequences of 512 tokens, clipping 1.0, bf16 compute; the loss only on each
response and its EOS.  finetune.layout: padded (one record per row) or packed
(whole records per row, attention inside each record).  Only how the model runs
(compute_dtype, remat_policy, attention_impl, impl, scan_unroll, layer_scan) may
differ from the parent's model.

The held-out loss is evaluated before the first step (metrics.jsonl, step 0) and
at the end.  Re-running the same command resumes exactly (same batches, same
losses); DIR's config.json names the parent (finetune.parent) and the data
(finetune.data_digest), and every reader opens DIR as any run (load_run,
analyze, eval, generate, export).
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "finetune", help="supervised fine-tuning of a run on instruction records (resumable)",
        description="Fine-tune a run's parameters on instruction records with the original "
                    "DepthBench's SFT recipe, into a new run directory.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("parent", metavar="PARENT_RUN", help="the run directory to fine-tune")
    p.add_argument("--records", required=True, metavar="FILE",
                   help="instruction records: local .json, .jsonl or .parquet (instruction, "
                        "input, output)")
    p.add_argument("--workdir", required=True, metavar="DIR", type=directory,
                   help="the fine-tuned run's directory (new, empty, or this fine-tuning's "
                        "to resume)")
    p.add_argument("--config", default="sft", metavar="SPEC",
                   help="the recipe's spec (default sft, the original's); fields can be "
                        "overridden with --config.section.field=value")
    p.add_argument("--json", action="store_true", help="print result.json instead of a summary")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_finetune, accepts_overrides=True)


def _finetune(args) -> int:
    from depthbench.cli.train import report
    from depthbench.finetune import plan, trainer  # late: keeps --help fast
    from depthbench.run import open_run

    parent = open_run(args.parent, plan.WHAT)
    trainer.check_workdir(args.workdir, parent.path)  # before the records are prepared
    ready = plan.from_command(args.parent, args.records, args.config, args.overrides,
                              progress=not args.no_progress)
    result = trainer.finetune(ready, args.workdir, progress=not args.no_progress)
    f = result.get("finetune") or {}
    before, after = f.get("initial_val_loss"), result.get("final_val_loss")
    losses = () if before is None or after is None else (
        f"held-out instruction loss: {before:.4f} (parent, step {f.get('parent_step')}) -> "
        f"{after:.4f}",)
    return report(result, args.workdir, args.json,
                  f"{args.workdir} already holds this fine-tuning, finished; not retraining",
                  losses)
