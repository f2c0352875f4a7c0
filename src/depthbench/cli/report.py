"""`depthbench report DIR`: tables and plots of a sweep directory.

Writes DIR/report.md, DIR/results.csv (refreshed from the run directories),
DIR/loss_vs_aspect.png, DIR/training_curves.png and DIR/costs_vs_aspect.png,
and prints the loss table.  Exit status: 0 ok, 2 no sweep in DIR.
"""

from __future__ import annotations

import argparse
import json
import sys

from depthbench import report as reportlib
from depthbench.formatting import table

EPILOG = """\
examples:
  depthbench report runs/quickstart
  depthbench report gs://BUCKET/400m --json
  depthbench report runs/micro_all --no-plots

For every family and shape the best learning rate is the finished,
non-diverged run with the lowest final validation loss; the family's best
aspect ratio is the shape with the lowest such loss.  A paper-400m sweep is
compared with the published losses of spec/shapes_and_recipe.md.
"""


def _strip_bold(cells: list[str]) -> list[str]:
    return [c.replace("**", "") + (" *" if c.startswith("**") else "") for c in cells]


def _run(args: argparse.Namespace) -> int:
    rep = reportlib.write_report(args.workdir, plots=not args.no_plots)
    if args.json:
        json.dump(reportlib.summary_json(rep), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return 0
    for suite, family_rows in rep.summary.items():
        print(f"validation loss by aspect ratio, {'suite ' + suite if suite else 'shape rule'} "
              "(best lr per shape; * = family's best aspect ratio)")
        headers, body = reportlib.loss_table(family_rows)
        print(table(headers, [_strip_bold(r) for r in body], align="l"))
        print()
    for what, path in rep.files.items():
        print(f"{what:>16}: {path}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report",
        help="tables (markdown, CSV) and plots of a sweep directory",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("workdir", metavar="DIR", help="a sweep directory (local or gs://...)")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument("--json", action="store_true",
                        help="print the per-family summary as JSON instead of the table")
    parser.set_defaults(func=_run)
