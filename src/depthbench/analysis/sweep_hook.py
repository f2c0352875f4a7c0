"""The sweep's analysis switch: ``config.analysis.enabled`` analyses each run
the sweep finishes (``RUN_DIR/analysis/``), so ``depthbench report`` can show
the depth analyses beside the losses."""

from __future__ import annotations

import time
import traceback

from depthbench.analysis.store import analysis_path
from depthbench.rundir.names import FAILURE_FILE


def after_run(config, run_dir, log, progress: bool = False) -> str | None:
    """Analyse ``run_dir`` if the config asks for it and it has no analysis
    yet; returns the analysis.json path, or None.  A failure is logged (with
    its traceback in ``analysis/failure.txt``) and does not stop the sweep:
    the run itself is done."""
    a = config.get("analysis")
    if a is None or not a.get("enabled", False) or "://" in str(run_dir):
        return None
    out = analysis_path(run_dir)
    if out.exists():
        return str(out)
    from depthbench.analysis.store import analyze_run_dir

    start = time.time()
    metrics = [m.strip() for m in str(a.metrics).split(",") if m.strip()] or None
    try:
        analyze_run_dir(run_dir, metrics, windows=int(a.windows), seq_len=int(a.seq_len),
                        progress=progress)
    except Exception as e:  # noqa: BLE001 - recorded; the trained run stays valid
        out.parent.mkdir(parents=True, exist_ok=True)
        (out.parent / FAILURE_FILE).write_text(traceback.format_exc())
        log(f"{run_dir}: analysis FAILED: {type(e).__name__}: {e} "
            f"(traceback in {out.parent / FAILURE_FILE})")
        return None
    log(f"{run_dir}: analysed in {time.time() - start:.0f} s -> {out}")
    return str(out)
