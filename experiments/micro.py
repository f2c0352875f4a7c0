"""The bundled spec ``micro`` (src/depthbench/configs/micro.py), at its familiar path.

``--config experiments/micro.py`` and ``--config micro`` are the same spec.  Specs
of your own go in this directory (or anywhere) and start from the bundled
ones: ``from depthbench.configs import micro``.
"""

from depthbench.configs.micro import *  # noqa: F403
