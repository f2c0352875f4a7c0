"""The bundled spec ``quickstart`` (src/depthbench/configs/quickstart.py), at its familiar path.

``--config experiments/quickstart.py`` and ``--config quickstart`` are the same spec.  Specs
of your own go in this directory (or anywhere) and start from the bundled
ones: ``from depthbench.configs import quickstart``.
"""

from depthbench.configs.quickstart import *  # noqa: F403
