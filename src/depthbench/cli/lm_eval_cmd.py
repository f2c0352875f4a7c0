"""``depthbench lm-eval ARGS...``: lm-eval's own command line with the ``depthbench``
model registered (for lm-eval releases that do not read the ``lm_eval.models``
entry point, 0.4.13 included).

Everything after ``lm-eval`` goes to lm-eval unchanged; its exit status is returned.
"""

from __future__ import annotations

import argparse
import sys

EPILOG = """\
examples:
  depthbench lm-eval --model depthbench --model_args run=runs/demo --batch_size 16 \\
      --tasks arc_easy,piqa
  depthbench lm-eval ls tasks
"""


def _run(args: argparse.Namespace) -> int:
    return passthrough(args.lm_eval_args)


def passthrough(lm_eval_args: list[str]) -> int:
    """Run lm-eval's CLI on ``lm_eval_args`` with the depthbench model registered."""
    from depthbench.errors import EXIT_BAD_INPUT

    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        sys.stderr.write("depthbench: error: lm-eval is not installed; "
                         "pip install 'depthbench[eval]'\n")
        return EXIT_BAD_INPUT
    import depthbench.evaluation.lm_backend  # noqa: F401  (registers --model depthbench)

    saved = sys.argv
    sys.argv = ["lm-eval", *lm_eval_args]
    try:
        cli_evaluate()
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        sys.argv = saved
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "lm-eval", help="lm-eval's command line with --model depthbench available",
        description=__doc__.split("\n\n")[0], epilog=EPILOG, add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="arguments for lm-eval")
    p.set_defaults(func=_run)
