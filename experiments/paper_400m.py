"""The bundled spec ``paper_400m``, at its familiar path.

``--config experiments/paper_400m.py`` and ``--config paper_400m`` are the same spec
(src/depthbench/configs/paper_400m.py).  Specs of your own go in this directory
(or anywhere) and start from the bundled ones:
``from depthbench.configs import paper_400m``.
"""

from depthbench.configs.paper_400m import *  # noqa: F403
