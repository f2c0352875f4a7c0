"""``depthbench train``: train one model into a run directory (resumable)."""

from __future__ import annotations

import argparse
import json
import sys

from depthbench import config as config_lib
from depthbench.cli.validators import directory
from depthbench.errors import EXIT_DIVERGED, EXIT_OK

EPILOG = """\
examples:
  depthbench train --config micro --workdir runs/demo --dry-run
  depthbench train --config micro --workdir runs/demo
  depthbench train --config micro --workdir runs/hc-L8 \\
      --config.model.family=hc --config.model.depth=8 --config.train.lr=2e-3
  depthbench train --config paper_400m --workdir /mnt/runs/pre_ln-L24 \\
      --config.parallel.fsdp=8 --config.model.depth=24

Re-running the same command on the same --workdir resumes from the latest
checkpoint (exactly: same batches, same losses); a finished run is not retrained.
SIGTERM / Ctrl-C save a checkpoint at the next step and exit 0.
A damaged latest checkpoint is skipped (with a warning) for the newest intact one.
Exit status: 0 finished / preempted / already done, 2 bad input, 3 diverged,
4 disk full or read-only (free space and re-run: it resumes).
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="train one model into a run directory (resumable)",
        description="Train one model (one family at one shape) and write config.json, "
                    "metrics.jsonl, TensorBoard events, Orbax checkpoints and result.json "
                    "into --workdir.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, metavar="SPEC",
                        help="experiment spec file, e.g. micro; fields can be "
                             "overridden with --config.section.field=value")
    parser.add_argument("--workdir", required=True, metavar="DIR", type=directory,
                        help="run directory (created; an existing one is resumed); on several "
                             "hosts, a path they all share")
    parser.add_argument("--json", action="store_true",
                        help="print result.json on stdout instead of the summary table")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the config, data files, mesh and --workdir, print the "
                             "resolved shape, parameter count, mesh and data; train nothing")
    parser.set_defaults(func=_train, accepts_overrides=True)


def _dry_run(config, args) -> int:
    from depthbench import dryrun

    rows = dryrun.describe_train(config, args.workdir)
    if args.json:
        print(json.dumps(dict(rows), indent=1))
    else:
        width = max(len(k) for k, _ in rows)
        print(f"{args.config} (dry run: nothing trained)")
        print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0


def _train(args) -> int:
    config = config_lib.load(args.config, args.overrides)
    if args.dry_run:
        return _dry_run(config, args)
    from depthbench.train import loop  # late: keeps `depthbench --help` fast

    result = loop.run(config, args.workdir, progress=not args.no_progress)
    return report(result, args.workdir, args.json,
                  f"{args.workdir} already holds a finished run; not retraining (delete "
                  f"{args.workdir}/result.json to evaluate again, or use a new --workdir)")


def report(result: dict, workdir: str, as_json: bool, already_done: str,
           after: tuple[str, ...] = ()) -> int:
    """What a training command prints when its run ends (``train``, ``finetune``):
    result.json with ``--json``; the preemption message; else ``already_done`` if
    the run was finished before, the summary and the lines ``after``.  Process 0
    reports for all of a multi-process run.  Returns the exit status."""
    from depthbench import parallel
    from depthbench.train import summary

    if parallel.is_main_process():
        if as_json:
            print(json.dumps(result, indent=1))
        elif result.get("status") == "preempted":
            print(result["message"])
        else:
            if result.get("already_done"):
                print(already_done)
            print(summary.summary(result, workdir))
            print("\n".join(after), end="\n" if after else "")
        sys.stdout.flush()
    return EXIT_DIVERGED if result.get("diverged") else EXIT_OK
