"""The sweep's fine-tuning switch: a spec with ``finetune.records`` set fine-tunes
each finished run into ``RUN_DIR/sft/`` and evaluates it (docs/FINETUNE.md,
"In a sweep").  A failure other than bad input or a full disk goes to
``RUN_DIR/sft/failure.txt`` and the sweep goes on; on several hosts it is
skipped with a note."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path

from depthbench import faults
from depthbench.errors import ConfigError
from depthbench.rundir.io import DamagedFile, read_json
from depthbench.rundir.names import EVAL_DIR, FAILURE_FILE, FINETUNE_DIR, RESULT_FILE


def requested(config) -> bool:
    """Whether ``config`` (a pretraining run's) asks for a fine-tuning."""
    f = config.get("finetune")
    return f is not None and bool(str(f.get("records", "")).strip()) and not f.get("parent")


def _recorded(out: Path) -> dict | None:
    try:
        return read_json(out / RESULT_FILE)
    except DamagedFile:
        return None  # finished again from its last checkpoint


def pending(config, run_dir: str | Path) -> bool:
    """Whether something is left to do (cheap: no lock, no model)."""
    if not requested(config):
        return False
    from depthbench.evaluation.after_training import requested as suites

    out = Path(run_dir) / FINETUNE_DIR
    result = _recorded(out)
    if result is None:
        return True
    if result.get("status") != "finished" or result.get("diverged"):
        return False
    return any(not (out / EVAL_DIR / f"{s}.json").exists() for s in suites(config))


def after_run(config, run_dir: str | Path, log: Callable[[str], None], *,
              progress: bool = False) -> dict | None:
    """Fine-tune and evaluate ``run_dir`` if its config asks and it is not done;
    the fine-tuning's result dict (its ``status`` may be "preempted"), or None."""
    if not pending(config, run_dir):
        return None
    import jax

    out = Path(run_dir) / FINETUNE_DIR
    if jax.process_count() > 1:
        log(f"{run_dir}: fine-tuning after training runs on one host; run `depthbench "
            "finetune` per run instead")
        return None
    from depthbench.evaluation.after_training import maybe_evaluate
    from depthbench.finetune import plan, trainer

    start = time.time()
    result = _recorded(out)
    try:
        if result is None:
            ready = plan.from_sweep_run(config, run_dir, progress=progress)
            result = trainer.finetune(ready, out, progress=progress)
            if result.get("status") == "preempted":
                return result
            before = (result.get("finetune") or {}).get("initial_val_loss")
            log(f"{run_dir}: fine-tuned in {time.time() - start:.0f} s, held-out loss "
                f"{_fmt(before)} -> {_fmt(result.get('final_val_loss'))} ({out})")
        maybe_evaluate(config, out, result, progress=progress)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - recorded; the trained run stays valid
        if faults.is_storage_error(e):
            raise  # no room to record it either: the sweep's one line says it
        out.mkdir(parents=True, exist_ok=True)
        (out / FAILURE_FILE).write_text(traceback.format_exc())
        log(f"{run_dir}: fine-tuning FAILED: {type(e).__name__}: {e} (traceback in "
            f"{out / FAILURE_FILE})")
        return None
    return result


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4f}"
