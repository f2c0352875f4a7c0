"""The bundled spec ``quickstart``, at its familiar path.

``--config experiments/quickstart.py`` and ``--config quickstart`` are the same spec
(src/depthbench/configs/quickstart.py).  Specs of your own go in this directory
(or anywhere) and start from the bundled ones:
``from depthbench.configs import quickstart``.
"""

from depthbench.configs.quickstart import *  # noqa: F403
