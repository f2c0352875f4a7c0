"""Depth analyses of trained models: ``load_run`` and the metrics of docs/spec/analysis.md."""

from depthbench.analysis.run import Run, init_run, load_run

__all__ = ["Run", "init_run", "load_run"]
