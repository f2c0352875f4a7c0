"""The bundled spec ``paper_1p6b``, at its familiar path.

``--config experiments/paper_1p6b.py`` and ``--config paper_1p6b`` are the same spec
(src/depthbench/configs/paper_1p6b.py).  Specs of your own go in this directory
(or anywhere) and start from the bundled ones:
``from depthbench.configs import paper_1p6b``.
"""

from depthbench.configs.paper_1p6b import *  # noqa: F403
