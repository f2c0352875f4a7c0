"""`python -m depthbench` is the `depthbench` command."""

from depthbench.cli import entry

entry()
