"""This environment as the core install sees it: only depthbench's own dependencies.

README's main job installs the package alone (``pip install -e .``), while the
tests run where the ``dev`` extra installed torch, transformers, lm-eval and
more.  :func:`hide_extras` writes a ``sitecustomize.py`` into a folder; a
process started with that folder first on ``PYTHONPATH`` sees every
distribution outside :func:`core_distributions` as not installed: importing one
of its modules raises ``ModuleNotFoundError``, ``importlib.util.find_spec``
returns None and ``importlib.metadata`` does not list it.  A command that needs
an extra fails there as it would after the core install
(tests/integration/test_readme_commands.py runs the main job that way).
"""

from __future__ import annotations

import importlib.metadata as metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# What `python3 -m venv` puts in every environment (the corpus is fetched with pip).
VENV = ("pip", "setuptools")

_TEMPLATE = '''"""Written by tests/helpers/core_only.py: distributions outside the core install
are hidden from this process (importing, finding and their metadata)."""
import importlib.metadata as _metadata
import importlib.util as _util
import sys as _sys

_HIDDEN_MODULES = frozenset({modules!r})
_HIDDEN_DISTRIBUTIONS = frozenset({distributions!r})


def _hidden(name):
    parts = name.split(".")
    return any(".".join(parts[:i]) in _HIDDEN_MODULES for i in range(1, len(parts) + 1))


class _Hide:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if _hidden(name):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


_find_spec = _util.find_spec


def _find_spec_or_none(name, package=None):
    try:
        return _find_spec(name, package)
    except ModuleNotFoundError as e:
        if e.name is not None and _hidden(e.name):
            return None
        raise


_discover = _metadata.Distribution.discover.__func__


def _discover_shown(cls, **kwargs):
    for dist in _discover(cls, **kwargs):
        name = dist.metadata["Name"] or ""
        if name.lower().replace("_", "-").replace(".", "-") not in _HIDDEN_DISTRIBUTIONS:
            yield dist


_sys.meta_path.insert(0, _Hide)
_util.find_spec = _find_spec_or_none
_metadata.Distribution.discover = classmethod(_discover_shown)
'''


def _name(dist: metadata.Distribution) -> str:
    return canonicalize_name(dist.metadata["Name"] or "")


def core_distributions(root: str = "depthbench", extras: tuple[str, ...] = ()) -> set[str]:
    """``root`` and what its requirements need, transitively (markers evaluated for
    this interpreter, with ``root``'s ``extras``: none, the core install), plus
    :data:`VENV`; canonical names."""
    seen: set[tuple[str, frozenset]] = set()
    todo = [(root, frozenset(extras))]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e})
                                         for e in (extras or {""})):
                todo.append((req.name, frozenset(req.extras)))
    return {name for name, _ in seen} | set(VENV)


def _modules(dist: metadata.Distribution) -> set[str]:
    """The dotted module and package names a distribution's files make importable."""
    found = set()
    for file in dist.files or []:
        parts = list(file.parts)
        if not parts or parts[0] == ".." or any(p.endswith((".dist-info", ".data", ".egg-info"))
                                                or p == "__pycache__" for p in parts):
            continue
        stem = parts[-1].split(".", 1)[0]
        if not parts[-1].endswith((".py", ".so", ".pyd")):
            parts = parts[:-1]  # data files: their folders only
        else:
            parts = parts[:-1] + ([] if stem == "__init__" else [stem])
        for i in range(1, len(parts) + 1):
            if all(p.isidentifier() for p in parts[:i]):
                found.add(".".join(parts[:i]))
    return found


def extra_only(extras: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """``(modules, distributions)`` installed here by something other than the core
    (with depthbench's ``extras``): the shortest module names that no such
    distribution provides, and the names of the distributions outside
    :func:`core_distributions`."""
    core = core_distributions(extras=extras)
    core_modules: set[str] = set()
    other_modules: set[str] = set()
    others = set()
    for dist in metadata.distributions():
        if _name(dist) in core:
            core_modules |= _modules(dist)
        else:
            others.add(_name(dist))
            other_modules |= _modules(dist)
    hidden = other_modules - core_modules

    def has_hidden_parent(module: str) -> bool:
        parts = module.split(".")
        return any(".".join(parts[:i]) in hidden for i in range(1, len(parts)))

    return sorted(m for m in hidden if not has_hidden_parent(m)), sorted(others)


def hide_extras(folder: Path, keep: tuple[str, ...] = ()) -> Path:
    """Write ``folder/sitecustomize.py`` (see the module docstring), hiding what
    neither the core nor the extras ``keep`` install; returns ``folder``."""
    modules, distributions = extra_only(keep)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        _TEMPLATE.format(modules=modules, distributions=distributions))
    return folder
