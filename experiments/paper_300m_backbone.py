"""The bundled spec ``paper_300m_backbone``, at its familiar path.

``--config experiments/paper_300m_backbone.py`` and ``--config paper_300m_backbone``
are the same spec
(src/depthbench/configs/paper_300m_backbone.py).  Specs of your own go in this directory
(or anywhere) and start from the bundled ones:
``from depthbench.configs import paper_300m_backbone``.
"""

from depthbench.configs.paper_300m_backbone import *  # noqa: F403
