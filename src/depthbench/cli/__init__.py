"""The ``depthbench`` command line: one sub-command per module in this package.

Each module ``cli/<name>.py`` exposes ``register(subparsers)``, which adds its
sub-command and sets ``func`` on the parser.  ``main`` turns every
:class:`~depthbench.errors.ConfigError` (bad input) into one line on stderr
and exit status 2; other exit statuses are documented by each command.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from depthbench.errors import EXIT_BAD_INPUT, ConfigError

# Sub-command modules, in the order `depthbench --help` lists them.
COMMANDS = ("shapes", "costs", "families", "data", "train", "sweep", "report")


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 like every bad input."""

    def error(self, message: str) -> None:  # noqa: D401
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="depthbench",
        description="Residual-connection designs at a fixed parameter budget, from width to depth.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 ok, 2 bad input (one line on stderr), 3 training diverged.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"depthbench.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"depthbench.cli.{name}":
                continue  # sub-command not built yet in this checkout
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT if args.command is None and argv else 0
    # `--config.a.b=value` overrides are the only unknown arguments allowed.
    overrides = [a for a in extra if a.startswith("--config.")]
    unknown = [a for a in extra if not a.startswith("--config.")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if overrides and not getattr(args, "accepts_overrides", False):
        parser.error(f"'{args.command}' takes no --config.* overrides")
    args.overrides = overrides
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        sys.stderr.write(f"depthbench: error: {e}\n")
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `depthbench shapes ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
