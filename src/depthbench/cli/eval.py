"""``depthbench eval RUN_DIR --suite S | --tasks a,b``: downstream evaluation of a run."""

from __future__ import annotations

import argparse
import json
import sys

EPILOG = """\
examples:
  depthbench eval runs/quickstart/pre_ln-L8 --suite nll-code-stem-math --data-dir data/nll
  depthbench eval runs/tinyllama --suite commonsense --limit 200
  depthbench eval runs/demo --tasks arc_easy,piqa --batch-size 32
  depthbench eval runs/demo --tasks my_mc --include-path my_tasks/ --name my_mc

suites: nll-code-stem-math (completion-only NLL: mbpp, humaneval, sciq,
gpqa_diamond, gsm8k, math500), commonsense (7 zero-shot lm-eval tasks),
bbh-reasoning (10 zero-shot BBH tasks).  Data: the hub through `datasets`
where reachable, else --data-dir DIR with DIR/<task>.jsonl or .parquet
(docs/EVAL.md).  The lm-eval suites need `pip install 'depthbench[eval]'`.
"""


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _run(args: argparse.Namespace) -> int:
    from depthbench.evaluation import runner  # late: keeps `depthbench --help` fast

    result, path = runner.evaluate(
        args.run_dir, suite=args.suite, tasks=_csv(args.tasks) if args.tasks else None,
        name=args.name, data_dir=args.data_dir, include_path=args.include_path,
        limit=args.limit, batch_size=args.batch_size, max_length=args.max_length,
        step=args.step, num_fewshot=args.num_fewshot,
        only=_csv(args.only) if args.only else None, progress=not args.no_progress)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(summary(result))
    print(f"wrote {path} ({result['wall_seconds']:.1f} s)")
    return 0


def summary(result: dict) -> str:
    from depthbench.cli.shapes import table

    rows = []
    if "aggregate" in result:  # the NLL suite
        for name, r in result["tasks"].items():
            rows.append([name, r["category"], str(r["num_examples"]),
                         str(r["num_target_tokens"]), f"{r['nll_mean']:.4f}",
                         f"{r['perplexity']:.2f}"])
        for name, r in {**result["categories"], "all": result["aggregate"]}.items():
            rows.append([name, "", "", str(r["num_target_tokens"]), f"{r['nll_mean']:.4f}",
                         f"{r['perplexity']:.2f}"])
        return table(["task", "category", "examples", "target tokens", "nll_mean",
                      "perplexity"], rows, align="l")
    for task, metrics in result["tasks"].items():
        for key, value in metrics.items():
            if isinstance(value, float) and "stderr" not in key:
                rows.append([task, key, f"{value:.4f}"])
    return table(["task", "metric", "value"], rows, align="l")


def register(subparsers) -> None:
    from depthbench.cli.validators import non_negative_int, plain_name, positive_int

    p = subparsers.add_parser(
        "eval", help="downstream evaluation of a run (NLL suite, lm-eval task sets)",
        description=__doc__.split("\n\n")[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (trained or imported)")
    p.add_argument("--suite", help="nll-code-stem-math | commonsense | bbh-reasoning")
    p.add_argument("--tasks", help="comma-separated lm-eval task names (instead of --suite)")
    p.add_argument("--only", help="nll-code-stem-math: comma-separated subset of its tasks")
    p.add_argument("--name", type=plain_name,
                   help="result name (RUN_DIR/eval/NAME.json); default: the suite")
    p.add_argument("--data-dir", help="local records: DIR/<task>.jsonl or DIR/<task>.parquet")
    p.add_argument("--include-path", help="extra lm-eval task YAMLs (as lm-eval's own flag)")
    p.add_argument("--limit", type=positive_int, help="at most this many records per task")
    p.add_argument("--batch-size", type=positive_int, default=8,
                   help="sequences per model call (8)")
    p.add_argument("--max-length", type=positive_int,
                   help="context window in tokens (default: the run's train.seq_len)")
    p.add_argument("--num-fewshot", type=non_negative_int,
                   help="lm-eval suites: override the tasks' shots")
    p.add_argument("--step", type=non_negative_int, help="checkpoint step (default: latest)")
    p.add_argument("--json", action="store_true", help="print the result JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_run)
