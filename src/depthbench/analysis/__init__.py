"""Depth analyses of trained models: the metrics of docs/spec/analysis.md.
Nothing is imported here, so the CLI can read :mod:`depthbench.analysis.names`
without jax."""
