"""Depth analyses of trained models: ``load_run`` and the metrics of docs/spec/analysis.md.

``Run``, ``load_run``, ``init_run`` and ``analyze`` are imported lazily so
that the CLI can read :mod:`depthbench.analysis.names` without jax.
"""

from __future__ import annotations

__all__ = ["Run", "analyze", "init_run", "load_run"]


def __getattr__(name: str):
    if name in ("Run", "load_run", "init_run"):
        from depthbench.analysis import run

        return getattr(run, name)
    if name == "analyze":
        from depthbench.analysis.analyze import analyze

        return analyze
    raise AttributeError(f"module 'depthbench.analysis' has no attribute {name!r}")
