"""The specs that ship with depthbench, found by name (``--config quickstart``);
being modules of the package, they install with it.  ``base`` defines every
field; what a spec is and how specs build on each other: docs/CONFIG.md."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def names() -> list[str]:
    """The bundled specs, by name (``base``, ``micro``, ``quickstart`` ...)."""
    files = resources.files(__name__).iterdir()
    return sorted(f.name[:-3] for f in files if f.name.endswith(".py") and f.name[0] != "_")


def file_of(name: str) -> Path:
    """The file of the bundled spec ``name``, found without importing it (a spec
    imports the family registry, and jax with it: a second that ``depthbench data
    tokenize`` does not need)."""
    return Path(__file__).with_name(f"{name}.py")
