"""A run directory: what it holds (docs/RUNS.md) and how every reader and writer
opens it, one module per job (names, io, lock, integrity, restore, damage;
the identity that decides resuming is :mod:`depthbench.run_identity`)."""
