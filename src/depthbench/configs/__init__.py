"""The specs that ship with depthbench, found by name: ``--config quickstart``.

Each module here is an experiment spec: ``get_config()`` returns an
``ml_collections.ConfigDict`` and a sweep spec also has ``get_sweep()``.
``base`` defines every field (the schema); the others start from it::

    from depthbench.configs import base

A spec of your own is a file anywhere (``--config path/to/spec.py``) that
starts from these the same way.  Being modules of the package, they install
with it: a wheel needs no checkout.
"""

from __future__ import annotations

from importlib import resources


def names() -> list[str]:
    """The bundled specs, by name (``base``, ``micro``, ``quickstart`` ...)."""
    files = resources.files(__name__).iterdir()
    return sorted(f.name[:-3] for f in files if f.name.endswith(".py") and f.name[0] != "_")
