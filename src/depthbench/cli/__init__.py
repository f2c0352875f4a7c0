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
import shlex
import sys
import warnings
from typing import NoReturn

from depthbench import cpu_dots, faults, hostmem
from depthbench.errors import EXIT_BAD_INPUT, ConfigError
from depthbench.orbax_leftovers import quiet_orbax_leftovers

# Sub-command -> the module of this package that registers it, in the order
# `depthbench --help` lists them.
COMMANDS = {"shapes": "shapes", "costs": "costs", "families": "families", "data": "data",
            "train": "train", "finetune": "finetune", "sweep": "sweep", "report": "report",
            "import-hf": "import_hf", "import-olmo": "import_olmo", "export-hf": "export_hf",
            "export-olmo": "export_olmo", "eval": "eval", "lm-eval": "lm_eval_cmd",
            "generate": "generate", "analyze": "analyze", "coordcheck": "coordcheck"}


# Extra `section.field=value` overrides for every command that takes them, applied
# after the command line's (they win): how smoke tests shrink every documented
# command, including those a launch script starts, without editing it.
OVERRIDES_ENV = "DEPTHBENCH_OVERRIDES"

_EPILOG = f"""\
environment:
  {OVERRIDES_ENV}='train.steps=3 data.val_windows=8'
      extra --config.* overrides for every command that takes them (they win over
      the command line's); announced on stderr. For smoke tests of scripts.
  DEPTHBENCH_FAMILIES=my_families,...  modules that register residual families of
      your own, imported with the package (README: adding a family).
  DEPTHBENCH_MAX_RUNS=N   a sweep process trains at most N runs (sweep --max-runs).
  DEPTHBENCH_CACHE=DIR    data cache root (default ~/.cache/depthbench).
  DEPTHBENCH_MALLOC=system|mimalloc|keep  host memory for XLA:CPU's per-step temp
      buffer (depthbench.hostmem). system (default): glibc as configured, nothing
      re-executed. mimalloc: the command re-runs itself once, in place, with mimalloc
      preloaded and keeping freed memory (no page faults every step; faster CPU
      steps: bench/results/hostmem.md). keep: glibc keeps freed memory (one arena;
      deep narrow models slower).
  DEPTHBENCH_CPU_DOTS=auto|eigen|ynnpack  which library runs XLA:CPU's dots
      (depthbench.cpu_dots). auto (default): the faster one for this CPU's vendor as
      measured (bench/results/cpu_dots.md); a ynn_fusion_type in XLA_FLAGS wins.

Exit status: 0 ok, 2 bad input (one line on stderr), 3 training diverged,
4 disk full or read-only (one line on stderr; free space and re-run)."""


def env_overrides() -> list[str]:
    """``--config.*`` arguments from $DEPTHBENCH_OVERRIDES (whitespace-separated,
    shell quoting allowed; each ``section.field=value``, ``--config.`` optional)."""
    text = os.environ.get(OVERRIDES_ENV, "").strip()
    if not text:
        return []
    try:
        words = shlex.split(text)
    except ValueError as e:  # an unclosed quote: shlex's "No closing quotation"
        raise ConfigError(f"${OVERRIDES_ENV}: {str(e).lower()} in {text!r}; "
                          "expected section.field=value words, quoted as in a shell") from None
    out = []
    for word in words:
        word = word.removeprefix("--").removeprefix("config.")
        if not word.partition("=")[0] or "=" not in word:
            raise ConfigError(f"${OVERRIDES_ENV}: {word!r} is not section.field=value")
        out.append(f"--config.{word}")
    return out


def _missing_equals_hint(extra: list[str], unknown: list[str]) -> str:
    """`--config.train.steps 40` (a space, not '='): say how to write it."""
    for i, arg in enumerate(extra[:-1]):
        if arg.startswith("--config.") and "=" not in arg and extra[i + 1] in unknown:
            return f"; write {arg}={extra[i + 1]} (overrides take '=', not a space)"
    return ""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 like every bad input."""

    def error(self, message: str) -> None:  # noqa: D401
        # Like every other bad input: `depthbench: error: --option: what is allowed`.
        message = message.removeprefix("argument ")
        command = self.prog.removeprefix("depthbench").strip()
        if command and not message.startswith("-"):
            message = f"{command}: {message}"
        sys.stderr.write(f"depthbench: error: {message}\n")
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every sub-command, or of ``command`` alone when it names one:
    several commands' modules import jax, flax and Orbax (a second of start-up)
    that ``depthbench shapes`` or ``data tokenize`` never use."""
    parser = _Parser(
        prog="depthbench",
        description="Residual-connection designs at a fixed parameter budget, from width to depth.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in [COMMANDS[command]] if command in COMMANDS else COMMANDS.values():
        try:
            module = importlib.import_module(f"depthbench.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"depthbench.cli.{name}":
                continue  # sub-command not built yet in this checkout
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _dispatch(argv)
    except ConfigError as e:  # from anywhere: the parser, imports ($DEPTHBENCH_FAMILIES), the work
        sys.stderr.write(f"depthbench: error: {e}\n")
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `depthbench shapes ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a full or read-only disk, however the writer says it (TensorStore:
        if not (isinstance(e, faults.StorageError) or faults.is_storage_error(e)):  # ValueError)
            raise
        if not isinstance(e, faults.StorageError):
            e = faults.storage_error(e, None, faults.retry_hint(e))
        sys.stderr.write(f"depthbench: error: {e}\n")
        return faults.EXIT_STORAGE


def _dispatch(argv: list[str]) -> int:
    """Parse ``argv`` and run its command; bad input anywhere is a ConfigError."""
    hostmem.apply()  # as the command does (entry), short of re-executing: main() runs alike
    cpu_dots.setting()  # checked alike; applied by entry only, before jax starts
    if argv[:1] == ["lm-eval"]:  # lm-eval's own flags pass through untouched
        from depthbench.cli import lm_eval_cmd

        return lm_eval_cmd.passthrough(argv[1:])
    parser = build_parser(argv[0] if argv else None)
    args, extra = parser.parse_known_args(argv)
    if not getattr(args, "func", None):
        if args.command is None and argv:  # `depthbench --bogus`: options but no command
            parser.error(f"unrecognized arguments: {' '.join(extra)}; give a COMMAND first "
                         "(depthbench --help lists them)")
        parser.print_help()
        return 0
    # `--config.a.b=value` overrides are the only unknown arguments allowed.
    overrides = [a for a in extra if a.startswith("--config.")]
    unknown = [a for a in extra if not a.startswith("--config.")]
    if unknown:
        hint = _missing_equals_hint(extra, unknown)
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    if overrides and not getattr(args, "accepts_overrides", False):
        parser.error(f"'{args.command}' takes no --config.* overrides")
    if getattr(args, "accepts_overrides", False):
        from_env = env_overrides()
        if from_env:
            sys.stderr.write(f"depthbench: ${OVERRIDES_ENV} adds {' '.join(from_env)}\n")
        overrides = [*overrides, *from_env]
    args.overrides = overrides
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())


def entry() -> None:
    """Console-script entry point (and ``python -m depthbench``): host-memory
    settings first, before jax starts any thread (:mod:`depthbench.hostmem`; by
    default none; ``DEPTHBENCH_MALLOC=mimalloc`` re-executes the command once, in
    place, with mimalloc preloaded) and the CPU's dot library
    (:mod:`depthbench.cpu_dots`), then :func:`main`."""
    hostmem.apply_or_exit("depthbench")
    cpu_dots.apply_or_exit("depthbench")
    quiet_orbax_leftovers()
    finish(main())


def finish(code: int) -> NoReturn:
    """Exit with ``code``.  After a command's one error line (bad input, a storage
    error) the work it abandoned says nothing at exit (:func:`quiet_abandoned_work`).
    The console script ends here, and so does a script that runs :func:`main`
    under a fault of its own (tests/integration/test_faults.py's driver)."""
    if code in (EXIT_BAD_INPUT, faults.EXIT_STORAGE):
        quiet_abandoned_work()
    sys.exit(code)


def quiet_abandoned_work() -> None:
    """After a command's one error line: background work it abandoned says nothing
    as it is collected at exit.  An Orbax restore's reads report unraisable errors;
    an Orbax save stopped by a full disk leaves write coroutines that were never
    awaited, which Python reports as a ``RuntimeWarning`` at shutdown (seen under
    load, when the disk error came before every write had started)."""
    sys.unraisablehook = lambda unraisable: None
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited",
                            category=RuntimeWarning)
