"""Depth analyses of trained models: ``load_run`` and the metrics of docs/spec/analysis.md.

``Run``, ``load_run`` and ``init_run`` are imported lazily so that the CLI
can read :mod:`depthbench.analysis.names` without jax; the metrics are
``depthbench.analysis.analyze.analyze``.
"""

from __future__ import annotations

__all__ = ["Run", "init_run", "load_run"]


def __getattr__(name: str):
    if name in ("Run", "load_run", "init_run"):
        from depthbench.analysis import run

        return getattr(run, name)
    raise AttributeError(f"module 'depthbench.analysis' has no attribute {name!r}")
