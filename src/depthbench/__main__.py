"""`python -m depthbench` is the `depthbench` command."""

import sys

from depthbench.cli import main

sys.exit(main())
