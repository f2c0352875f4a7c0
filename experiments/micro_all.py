"""The bundled spec ``micro_all``, at its familiar path.

``--config experiments/micro_all.py`` and ``--config micro_all`` are the same spec
(src/depthbench/configs/micro_all.py).  Specs of your own go in this directory
(or anywhere) and start from the bundled ones:
``from depthbench.configs import micro_all``.
"""

from depthbench.configs.micro_all import *  # noqa: F403
