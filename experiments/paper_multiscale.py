"""The bundled spec ``paper_multiscale``, at its familiar path.

``--config experiments/paper_multiscale.py`` and ``--config paper_multiscale`` are the same spec
(src/depthbench/configs/paper_multiscale.py).  Specs of your own go in this directory
(or anywhere) and start from the bundled ones:
``from depthbench.configs import paper_multiscale``.
"""

from depthbench.configs.paper_multiscale import *  # noqa: F403
