"""Depth analyses of trained models: the metrics of docs/spec/analysis.md.

A trained (or imported) model is :func:`depthbench.run.load_run`'s; the
metrics are ``depthbench.analysis.analyze.analyze``.  Nothing is imported
here, so the CLI can read :mod:`depthbench.analysis.names` without jax.
"""
