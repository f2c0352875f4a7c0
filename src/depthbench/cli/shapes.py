"""`depthbench shapes`: the shapes of a suite, or of the shape rule at a budget.

Also the ``--suite | --budget`` selection ``costs`` shares."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from depthbench import shapes
from depthbench.cli.validators import positive_int
from depthbench.errors import ConfigError
from depthbench.formatting import fmt_count, parse_count, table

__all__ = ["Selection", "add_shape_arguments", "fmt_count", "parse_budget", "parse_depths",
           "select_shapes", "table"]

EPILOG = """\
examples:
  depthbench shapes --suite paper-400m
  depthbench shapes --budget 400M --vocab 50280 --depths 16,24,70
  depthbench shapes --budget 300M --fix backbone --depths 24,32 --json

--suite prints a suite's explicit table; suites:
{suites}
--budget applies the shape rule of spec/shapes_and_recipe.md to each depth:
the even head_dim (d_model = heads * head_dim) whose parameter count is
closest to the budget, d_ff = ceil(8/3 d) rounded up to a multiple of 16.
"""


@dataclasses.dataclass(frozen=True)
class Selection:
    """The shapes a ``--suite`` or ``--budget`` selection names."""

    title: str  # the header line naming the suite or budget
    budget: float
    fix: str  # "total" | "backbone": which count the budget holds
    shapes: list[shapes.Shape]


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """``--suite NAME | --budget COUNT`` plus the rule's knobs."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--suite", metavar="NAME", help=f"a suite's explicit table: {', '.join(shapes.SUITES)}"
    )
    which.add_argument(
        "--budget",
        metavar="COUNT",
        help="a parameter budget for the shape rule, e.g. 400M, 1.6B, 4e8",
    )
    parser.add_argument(
        "--depths",
        metavar="L,L,...",
        help="comma-separated depths (required with --budget; with --suite "
        "selects rows of the table)",
    )
    parser.add_argument(
        "--vocab",
        metavar="V",
        type=positive_int,
        help=f"vocabulary size (default: the suite's, or {shapes.PAPER_VOCAB} with --budget)",
    )
    parser.add_argument(
        "--heads", metavar="H", type=positive_int, help="query heads (default: the suite's, or 16)"
    )
    parser.add_argument(
        "--kv-heads",
        metavar="H",
        type=positive_int,
        help="key/value heads for GQA (default: the suite's, or --heads)",
    )
    parser.add_argument(
        "--fix",
        choices=("total", "backbone"),
        help="with --budget: the count the budget holds (default total)",
    )


def parse_depths(text: str) -> list[int]:
    """'16,24,70' -> [16, 24, 70]; anything else is a one-line ConfigError."""
    try:
        depths = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        depths = []
    if not depths or min(depths) < 1:
        raise ConfigError(
            f"--depths: expected comma-separated positive integers like 16,24,70, got {text!r}"
        )
    return depths


def parse_budget(text: str) -> float:
    try:
        budget = parse_count(text)
    except ValueError:
        budget = float("nan")
    if not budget > 0 or budget == float("inf"):
        raise ConfigError(
            f"--budget: expected a positive parameter count like 400M, 1.6B or 4e8, got {text!r}"
        )
    return budget


def select_shapes(args: argparse.Namespace) -> Selection:
    """Resolve ``--suite``/``--budget`` and the knobs into shapes (or ConfigError)."""
    if args.suite is not None:
        if args.suite not in shapes.SUITES:
            raise ConfigError(
                f"--suite: {args.suite!r} is unknown; allowed: {', '.join(shapes.SUITES)}"
            )
        if args.fix is not None:
            raise ConfigError(
                f"--fix: applies only with --budget (suite {args.suite!r} holds "
                f"its {shapes.SUITES[args.suite].fix} count fixed)"
            )
        suite = shapes.SUITES[args.suite]
        rows = suite.shapes()
        if args.depths is not None:
            by_depth = {s.depth: s for s in rows}
            depths = parse_depths(args.depths)
            missing = [d for d in depths if d not in by_depth]
            if missing:
                raise ConfigError(
                    f"--depths: suite {suite.name!r} has no depth {missing[0]}; allowed: "
                    f"{', '.join(map(str, by_depth))} (or use --budget for the shape rule)"
                )
            rows = [by_depth[d] for d in depths]
        vocab = args.vocab or suite.vocab_size
        heads = args.heads or suite.n_heads
        kv = args.kv_heads or (suite.n_kv_heads if heads == suite.n_heads else heads)
        rows = [
            dataclasses.replace(s, vocab_size=vocab, n_heads=heads, n_kv_heads=kv) for s in rows
        ]
        title = (
            f"suite {suite.name}: {suite.description}; budget {fmt_count(suite.budget)} "
            f"{suite.fix} parameters, vocab {vocab}"
        )
        selection = Selection(title, suite.budget, suite.fix, rows)
    else:
        budget = parse_budget(args.budget)
        if args.depths is None:
            raise ConfigError("--depths: required with --budget, e.g. --depths 16,24,70")
        depths = parse_depths(args.depths)
        vocab = args.vocab or shapes.PAPER_VOCAB
        heads = args.heads or 16
        kv = args.kv_heads or heads
        fix = args.fix or "total"
        try:
            rows = [
                shapes.from_rule(budget, vocab, depth, n_heads=heads, fix=fix, n_kv_heads=kv)
                for depth in depths
            ]
        except ConfigError as e:  # name this command's flags, not the config fields
            text = str(e).replace("config.model.depth", "--depths")
            raise ConfigError(text.replace("config.model.budget", "--budget")) from None
        kv_text = f" ({kv} KV heads)" if kv != heads else ""
        title = (
            f"shape rule: budget {fmt_count(budget)} {fix} parameters, vocab {vocab}, "
            f"{heads} heads{kv_text}"
        )
        selection = Selection(title, budget, fix, rows)
    for s in selection.shapes:
        if s.d_model % s.n_heads or s.head_dim % 2:
            raise ConfigError(
                f"--heads: {s.n_heads} heads must split d_model {s.d_model} into "
                "even head dimensions"
            )
        if s.n_heads % s.n_kv_heads:
            raise ConfigError(f"--kv-heads: {s.n_kv_heads} must divide --heads {s.n_heads}")
    return selection


def _run(args: argparse.Namespace) -> int:
    sel = select_shapes(args)
    if args.json:
        json.dump([s.as_dict() for s in sel.shapes], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    headers = [
        "depth",
        "d_model",
        "d_ff",
        "heads",
        "kv_heads",
        "head_dim",
        "aspect",
        "backbone",
        "total",
        "vs budget",
    ]
    rows = []
    for s in sel.shapes:
        held = s.total_params if sel.fix == "total" else s.backbone_params
        rows.append(
            [
                str(s.depth),
                str(s.d_model),
                str(s.d_ff),
                str(s.n_heads),
                str(s.n_kv_heads),
                str(s.head_dim),
                f"{s.aspect_ratio:.2f}",
                fmt_count(s.backbone_params),
                fmt_count(s.total_params),
                f"{100 * (held / sel.budget - 1):+.2f}%",
            ]
        )
    print(sel.title)
    print(table(headers, rows))
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "shapes",
        help="model shapes of a suite or of the shape rule at a budget",
        description="Print model shapes (depth, width, MLP width, heads, aspect ratio = "
        "d_model / depth, parameter counts) of a suite or of the shape rule.",
        epilog=EPILOG.format(
            suites="\n".join(f"  {n:<20} {s.description}" for n, s in shapes.SUITES.items())
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_shape_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON list instead")
    parser.set_defaults(func=_run)
