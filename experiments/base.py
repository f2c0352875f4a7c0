"""The bundled spec ``base``, at its familiar path.

``--config experiments/base.py`` and ``--config base`` are the same spec
(src/depthbench/configs/base.py).  Specs of your own go in this directory
(or anywhere) and start from the bundled ones:
``from depthbench.configs import base``.
"""

from depthbench.configs.base import *  # noqa: F403
