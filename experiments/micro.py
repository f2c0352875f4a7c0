"""The bundled spec ``micro``, at its familiar path.

``--config experiments/micro.py`` and ``--config micro`` are the same spec
(src/depthbench/configs/micro.py).  Specs of your own go in this directory
(or anywhere) and start from the bundled ones:
``from depthbench.configs import micro``.
"""

from depthbench.configs.micro import *  # noqa: F403
