"""depthbench: residual-connection designs traded for depth at a fixed parameter budget.

``depthbench.load_run(run_dir)`` (see :mod:`depthbench.run`) is imported
lazily, so ``import depthbench`` stays light (no jax until it is used).
"""

from __future__ import annotations

__all__ = ["load_run"]


def __getattr__(name: str):
    if name == "load_run":
        from depthbench.run import load_run

        return load_run
    raise AttributeError(f"module 'depthbench' has no attribute {name!r}")
