"""Evaluate a run right after a sweep trained it, when its spec's ``eval.suites`` asks.

A suite whose JSON exists is not redone and diverged or preempted runs are
not evaluated (docs/EVAL.md, "In a sweep").  Bad input is a ConfigError like
any other; an unexpected failure is reported and the sweep goes on (the run
itself trained fine)."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from depthbench.errors import ConfigError
from depthbench.rundir.names import EVAL_DIR


def requested(config) -> list[str]:
    e = config.get("eval")
    if e is None or not str(e.get("suites", "")).strip():
        return []
    return [s.strip() for s in str(e.suites).split(",") if s.strip()]


def maybe_evaluate(config, run_dir: str | Path, result: dict, *, progress: bool = True
                   ) -> dict[str, str]:
    """{suite: path written} for every requested suite evaluated now."""
    suites = requested(config)
    if not suites or result.get("status") not in (None, "finished") or result.get("diverged"):
        return {}
    import jax

    from depthbench.evaluation import runner

    unknown = [s for s in suites if s not in runner.SUITES]
    if unknown:
        raise ConfigError(f"config.eval.suites: {unknown[0]!r} is unknown; allowed: "
                          f"{', '.join(runner.SUITES)}")
    if jax.process_count() > 1:
        print(f"eval: {run_dir}: evaluation after training runs on one host; run "
              "`depthbench eval` per run instead", file=sys.stderr)
        return {}
    e, written = config.eval, {}
    for suite in suites:
        if (Path(run_dir) / EVAL_DIR / f"{suite}.json").exists():
            continue
        try:
            _, path = runner.evaluate(run_dir, suite=suite, data_dir=str(e.data_dir) or None,
                                      limit=int(e.limit) or None, batch_size=int(e.batch_size),
                                      progress=progress)
        except ConfigError:
            raise
        except Exception as err:  # the run trained fine; its evaluation can be redone
            print(f"eval: {run_dir}: {suite} failed: {type(err).__name__}: {err}\n"
                  f"{traceback.format_exc(limit=3)}", file=sys.stderr)
            continue
        written[suite] = str(path)
    return written
