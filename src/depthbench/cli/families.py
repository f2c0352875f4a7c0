"""`depthbench families`: the registry of residual families and their overheads."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

from depthbench import shapes
from depthbench.cli.validators import positive_int
from depthbench.costs import terms
from depthbench.formatting import table
from depthbench.model.residual.protocol import registry
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import family_of

EPILOG = """\
examples:
  depthbench families
  depthbench families --d-model 640 --depth 70
  depthbench families --json

Extra parameters are what a family adds to a pre_ln model of the same shape
(negative when it drops the pre-norms); they are counted at width --d-model
(16 heads, d_ff by the shape rule, vocabulary {vocab}) and depth --depth;
state/token is the residual state's floats per token.  Descriptions are cut to
fit 100 columns; --json has them whole.
Set a family with --config.model.family=NAME.
"""


def _width(text: str) -> int:
    """--d-model: 16 heads of even head_dim, so a positive multiple of 32."""
    try:
        value = positive_int(text)
    except argparse.ArgumentTypeError:
        value = 0
    if not value or value % 32:
        raise argparse.ArgumentTypeError(f"expected a positive multiple of 32, got {text!r}")
    return value


def family_rows(d_model: int, depth: int) -> list[dict]:
    """One dict per registered family: describe() plus state size and shape."""
    shape = shapes.Shape(depth, d_model, shapes.rule_d_ff(d_model), 16, 16, shapes.PAPER_VOCAB)
    rows = []
    for name in registry.names():
        spec = ModelSpec.from_shape(shape, family=name)
        row, cost = dict(family_of(spec).describe()), terms(spec)
        row.update(
            name=name,
            extra_block_params=int(cost.extra_block_params()),
            extra_global_params=int(cost.extra_global_params()),
            state_floats_per_token=int(cost.state_floats_per_token()),
            d_model=d_model,
            depth=depth,
        )
        rows.append(row)
    return rows


def _run(args: argparse.Namespace) -> int:
    d_model, depth = args.d_model, args.depth
    rows = family_rows(d_model, depth)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    headers = ["family", "extra/block", "extra global", "state/token", "description"]
    cells = [
        [
            r["name"],
            f"{r['extra_block_params']:,}",
            f"{r['extra_global_params']:,}",
            f"{r['state_floats_per_token']:,}",
            r["description"],
        ]
        for r in rows
    ]
    print(f"{len(rows)} residual families; extra parameters at d_model {d_model}, depth {depth}")
    print(fit_table(headers, cells, align="lrrrl", width=WIDTH))
    # References are long: one wrapped entry each under the table keeps the table readable.
    print("\nreferences (full descriptions: depthbench families --json):")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        lines = textwrap.wrap(r["reference"], WIDTH - width - 4) or [""]
        print(f"  {r['name']:<{width}}  {lines[0]}")
        for more in lines[1:]:
            print(f"  {'':<{width}}  {more}")
    return 0


WIDTH = 100  # characters: the table and the references fit a terminal and the README


def fit_table(headers: list[str], cells: list[list[str]], *, align: str, width: int) -> str:
    """``table`` with the last column cut (at a word, ending in '...') so no line
    exceeds ``width`` characters."""
    lead = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers[:-1])]
    room = width - sum(lead) - 2 * len(lead)

    def cut(text: str) -> str:
        if len(text) <= room:
            return text
        return text[: room - 3].rsplit(" ", 1)[0].rstrip(" ,;:") + "..."

    return table(headers, [[*r[:-1], cut(r[-1])] for r in cells], align=align)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "families",
        help="the registered residual families, their papers and parameter overheads",
        description="List every registered residual family: name, description, paper, extra "
        "parameters per block and in total, residual-state floats per token.",
        epilog=EPILOG.format(vocab=shapes.PAPER_VOCAB),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--d-model",
        default=1024,
        type=_width,
        metavar="D",
        help="width at which extra parameters are counted (default 1024)",
    )
    parser.add_argument(
        "--depth", default=24, type=positive_int, metavar="L",
        help="depth for depth-dependent extras (default 24)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead")
    parser.set_defaults(func=_run)
