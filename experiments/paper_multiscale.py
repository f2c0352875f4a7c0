"""The bundled spec ``paper_multiscale`` (src/depthbench/configs/paper_multiscale.py), at its familiar path.

``--config experiments/paper_multiscale.py`` and ``--config paper_multiscale`` are the same spec.  Specs
of your own go in this directory (or anywhere) and start from the bundled
ones: ``from depthbench.configs import paper_multiscale``.
"""

from depthbench.configs.paper_multiscale import *  # noqa: F403
