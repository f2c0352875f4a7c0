"""A run directory's analysis: compute, write ``RUN_DIR/analysis/analysis.json``
(atomically) and its plots, read it back."""

from __future__ import annotations

from pathlib import Path

from depthbench.rundir.io import DamagedFile, atomic_write_json, json_safe, read_json
from depthbench.rundir.names import ANALYSIS_DIR, ANALYSIS_FILE


def analysis_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / ANALYSIS_DIR / ANALYSIS_FILE


def read_analysis(run_dir: str | Path) -> dict | None:
    """``RUN_DIR/analysis/analysis.json``, or None when the run was not analysed."""
    try:
        return read_json(analysis_path(run_dir))
    except DamagedFile as e:
        raise DamagedFile(e.path, f"{e.reason}; run `depthbench analyze` again") from None


def analyze_run_dir(run_dir: str | Path, metrics=None, *, windows: int = 16, seq_len: int = 128,
                    options: dict | None = None, plots: bool = True, progress: bool = True,
                    val_tokens: str | None = None, **kw) -> tuple[dict, list[Path]]:
    """Analyse the latest checkpoint of ``run_dir`` on ``windows`` held-out
    windows of ``seq_len`` tokens (of ``val_tokens``, a token .npy, when given;
    else the run's validation split); write analysis.json and the plots."""
    from depthbench.analysis.analyze import analyze, resolve_metrics
    from depthbench.analysis.plots import plot_run
    from depthbench.analysis.windows import held_out_windows
    from depthbench.run import load_run

    resolve_metrics(metrics)  # bad names fail before the model loads
    run = load_run(run_dir, options=options)
    result = analyze(run, held_out_windows(run, windows, seq_len, val_tokens), metrics,
                     progress=progress, **kw)
    out = analysis_path(run.run_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, json_safe(result))
    written = [out]
    if plots:
        written += plot_run(result, out.parent)
    return result, written
