"""``depthbench lm-eval ARGS...``: lm-eval's own command line with the ``depthbench``
model registered (for lm-eval releases that do not read the ``lm_eval.models``
entry point, 0.4.13 included)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from depthbench.cli.validators import non_negative_int, positive_int

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
    from depthbench.errors import ConfigError
    from depthbench.evaluation import lm_backend  # registers --model depthbench

    try:
        args = _depthbench_model_args(lm_eval_args)
        if args is not None:
            check_model_args(args, lm_backend.MODEL_ARGS)
            lm_backend.preload(args["run"], args.get("step"), args.get("batch_size", 8),
                               args.get("max_length"), args.get("max_gen_toks"))
    except ConfigError as e:
        text = str(e)  # the loader and the scorer name `eval`'s options; here: model args
        for option, arg in (("--step:", "step:"), ("--batch-size:", "batch_size:")):
            if text.startswith(option):
                text = f"--model_args: {arg}{text[len(option):]}"
        sys.stderr.write(f"depthbench: error: {text}\n")
        return EXIT_BAD_INPUT
    only_local, missing = task_plan(lm_eval_args)
    if missing:  # lm-eval's own words, without its index of every built-in task first
        sys.stderr.write(f"depthbench: error: lm-eval: Tasks not found: {', '.join(missing)}\n")
        return EXIT_BAD_INPUT
    saved = sys.argv
    sys.argv = ["lm-eval", *lm_eval_args]
    try:
        with _without_builtin_tasks() if only_local else contextlib.nullcontext():
            cli_evaluate()
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    except (ValueError, TypeError, OSError) as e:
        if not _rejected_by_lm_eval_checks(e):
            raise
        message = (str(e).strip().splitlines() or [type(e).__name__])[0]
        sys.stderr.write(f"depthbench: error: lm-eval: {message}\n")
        return EXIT_BAD_INPUT
    finally:
        sys.argv = saved
    return 0


# lm-eval's modules that check its command line and tasks before evaluating anything.
_LM_EVAL_CHECKS = (f"lm_eval{os.sep}config{os.sep}", f"lm_eval{os.sep}_cli{os.sep}")


def _rejected_by_lm_eval_checks(e: BaseException) -> bool:
    """Whether ``e`` was raised by lm-eval's argument and task checks (the innermost
    frame of its traceback is in one of their modules)."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return any(part in tb.tb_frame.f_code.co_filename for part in _LM_EVAL_CHECKS)


def task_plan(lm_eval_args: list[str]) -> tuple[bool, list[str]]:
    """``(only local, unknown)`` of an lm-eval command line that evaluates (``run``
    or no sub-command): whether lm-eval can index ``--include_path`` alone (every
    task asked for is a task defined there), and the tasks that are surely in no
    index (:func:`depthbench.evaluation.runner.resolve_tasks`).  ``ls``,
    ``validate`` and ``--config`` (which may add tasks): ``(False, [])``, lm-eval
    decides as it always does."""
    args = list(lm_eval_args)
    if args[:1] == ["run"]:
        args = args[1:]
    if not args or not args[0].startswith("-") or any(a.startswith("--config") for a in args):
        return False, []
    from depthbench.evaluation.runner import resolve_tasks

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--tasks", "-t", nargs="+", default=[])
    parser.add_argument("--include_path")
    known, _ = parser.parse_known_args(args)
    names = [n for arg in known.tasks for n in arg.split(",") if n]
    local, unknown = resolve_tasks(names, known.include_path)
    return local is not None, unknown


@contextlib.contextmanager
def _without_builtin_tasks():
    """lm-eval's command line, indexing only ``--include_path`` (:func:`task_plan`)."""
    import lm_eval.tasks

    builtin = lm_eval.tasks.TaskManager

    class LocalTaskManager(builtin):
        def __init__(self, *args, include_defaults: bool = False, **kwargs):
            super().__init__(*args, include_defaults=include_defaults, **kwargs)

    lm_eval.tasks.TaskManager = LocalTaskManager
    try:
        yield
    finally:
        lm_eval.tasks.TaskManager = builtin


def check_model_args(args: dict[str, str], allowed: tuple[str, ...]) -> None:
    """The depthbench model's ``--model_args``, checked before lm-eval starts: known
    names, a run, and counts that are counts (lm-eval would fail on them later,
    inside its own traceback, or not at all)."""
    from depthbench.errors import ConfigError

    unknown = [k for k in args if k not in allowed]
    if unknown:
        raise ConfigError(f"--model_args: {unknown[0]!r} is not an argument of the depthbench "
                          f"model; allowed: {', '.join(allowed)}")
    if not args.get("run"):
        raise ConfigError("--model_args: run=RUN_DIR is required for the depthbench model")
    checks = {"step": non_negative_int, "max_length": positive_int, "max_gen_toks": positive_int,
              "batch_size": _batch_size, "add_bos_token": _flag}
    for key, check in checks.items():
        if key in args:
            try:
                check(args[key])
            except argparse.ArgumentTypeError as e:
                raise ConfigError(f"--model_args: {key}: {e}") from None


def _batch_size(text: str) -> None:
    """lm-eval's forms: N, auto, auto:N."""
    if text != "auto":
        positive_int(text.removeprefix("auto:"))


def _flag(text: str) -> None:
    if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _depthbench_model_args(lm_eval_args: list[str]) -> dict[str, str] | None:
    """``--model_args`` as a dict when ``--model depthbench`` is asked for, else None
    (lm-eval's forms: ``-a k=v,k2=v2`` or ``-a k=v k2=v2``)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--model", "-M")
    parser.add_argument("--model_args", "-a", nargs="+", default=[])
    known, _ = parser.parse_known_args(lm_eval_args)
    if known.model != "depthbench":
        return None
    out = {}
    for arg in known.model_args:
        for item in arg.split(","):
            key, _, value = item.partition("=")
            if key.strip():
                out[key.strip()] = value.strip()
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "lm-eval", help="lm-eval's command line with --model depthbench available",
        description=__doc__.split("\n\n")[0], epilog=EPILOG, add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER, help="arguments for lm-eval")
    p.set_defaults(func=_run)
