"""A run directory's analysis: compute, write ``RUN_DIR/analysis/analysis.json``
(atomically) and its plots, read it back."""

from __future__ import annotations

import json
import os
from pathlib import Path

from depthbench.config import ConfigError

ANALYSIS_DIR = "analysis"
ANALYSIS_FILE = "analysis.json"


def analysis_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / ANALYSIS_DIR / ANALYSIS_FILE


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def read_analysis(run_dir: str | Path) -> dict | None:
    """``RUN_DIR/analysis/analysis.json``, or None when the run was not analysed."""
    path = analysis_path(run_dir)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: unreadable ({e}); run `depthbench analyze` again") from e


def analyze_run_dir(run_dir: str | Path, metrics=None, *, windows: int = 16, seq_len: int = 128,
                    options: dict | None = None, plots: bool = True, progress: bool = True,
                    **kw) -> tuple[dict, list[Path]]:
    """Analyse the latest checkpoint of ``run_dir`` on ``windows`` held-out
    windows of ``seq_len`` tokens; write analysis.json and the plots."""
    from depthbench.analysis.analyze import analyze, resolve_metrics
    from depthbench.analysis.plots import plot_run
    from depthbench.analysis.run import load_run
    from depthbench.analysis.windows import held_out_windows

    resolve_metrics(metrics)  # bad names fail before the model loads
    run = load_run(run_dir, options=options)
    result = analyze(run, held_out_windows(run, windows, seq_len), metrics, progress=progress,
                     **kw)
    out = analysis_path(run.run_dir)
    write_json(out, _finite(result))
    written = [out]
    if plots:
        written += plot_run(result, out.parent)
    return result, written


def _finite(obj):
    """JSON-safe: non-finite floats become None."""
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
