"""`depthbench report DIR`: tables and plots of a sweep directory, or of one run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from depthbench import report as reportlib
from depthbench.errors import ConfigError
from depthbench.formatting import table
from depthbench.rundir.names import CONFIG_FILE, MANIFEST, RESULTS_CSV

EPILOG = """\
examples:
  depthbench report runs/quickstart
  depthbench report runs/demo              # one run: summary, loss curves, per-block stats
  depthbench report gs://BUCKET/400m --json
  depthbench report runs/micro_all --no-plots

For every family and shape the best learning rate is the finished,
non-diverged run with the lowest final validation loss; the family's best
aspect ratio is the shape with the lowest such loss.  A paper-400m sweep is
compared with the published losses of spec/shapes_and_recipe.md.
"""


def _strip_bold(cells: list[str]) -> list[str]:
    return [c.replace("**", "") + (" *" if c.startswith("**") else "") for c in cells]


def _run_dir_report(args: argparse.Namespace, run_dir: Path) -> int:
    from depthbench import run_report

    rep = run_report.build(run_dir, plots=not args.no_plots)
    _warn(rep.warnings)
    if args.json:
        last = {stat: by_step[max(by_step)] for stat, by_step in rep.layer_stats.items()}
        json.dump({"files": rep.files, "layer_stats_last": last, "warnings": rep.warnings},
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    summary = rep.text.split("```text\n", 1)[1].split("\n```", 1)[0]
    print(summary)
    for what, path in rep.files.items():
        print(f"{what:>12}: {path}")
    return 0


def _warn(warnings: list[str]) -> None:
    for line in warnings:
        sys.stderr.write(f"depthbench: warning: {line}\n")


def _locate(workdir: str) -> Path | None:
    """The run directory ``workdir`` names, or None for a sweep; a missing local
    directory, or one holding neither, is bad input."""
    from depthbench import run_report

    if "://" in workdir:
        return None  # sweeps in buckets: the sweep report reads them
    path = Path(workdir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"report: {workdir!r} is a file; give a sweep or run directory")
    if not path.is_dir():
        raise ConfigError(f"report: directory {workdir!r} does not exist")
    if run_report.is_run_dir(path):
        return path
    if not (path / RESULTS_CSV).exists() and not (path / MANIFEST).exists():
        raise ConfigError(
            f"report: {workdir!r} holds neither a sweep ({RESULTS_CSV}) nor a run "
            f"({CONFIG_FILE}); "
            f"write one with `depthbench sweep --config SPEC --workdir {workdir}` or "
            f"`depthbench train --config SPEC --workdir {workdir}`")
    return None


def _run(args: argparse.Namespace) -> int:
    run_dir = _locate(args.workdir)
    if run_dir is not None:
        return _run_dir_report(args, run_dir)
    rep = reportlib.write_report(args.workdir, plots=not args.no_plots)
    _warn(rep.warnings)
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
    parser.add_argument("workdir", metavar="DIR",
                        help="a sweep directory (local or gs://...) or one run's directory")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument("--json", action="store_true",
                        help="print the per-family summary as JSON instead of the table")
    parser.set_defaults(func=_run)
