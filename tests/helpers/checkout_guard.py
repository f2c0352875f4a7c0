"""Which paths of the checkout a test session created, so no test writes into it.

:class:`CheckoutGuard` (registered by ``tests/conftest.py`` for the
repository) takes a :func:`snapshot` of the checkout when the session starts
and another when it ends; :func:`created` names what is new, and the session
fails naming it.  Tests write under ``tmp_path`` (or another temporary directory); a file a test
leaves in the checkout (a ``build/`` from a wheel build, a ``runs/`` from a
command run in the repository's directory) would be committed by accident or
change what the next test sees.

Files are compared by path only: caches Python and pytest keep beside the
sources and the environment the README's commands create are not the tests'
doing, and are left out (:data:`LEFT_OUT`).
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import pytest

# Directory names never looked into: git's own, the virtual environment, and
# the caches Python, pytest and packaging write wherever they run.
LEFT_OUT = (".git", ".venv", "__pycache__", ".pytest_cache", "*.egg-info")


def _left_out(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in LEFT_OUT)


def snapshot(root: Path, skip: Path | None = None) -> frozenset[str]:
    """Every file and directory under ``root`` (paths relative to it, ``/``-separated),
    not looking into :data:`LEFT_OUT` nor into ``skip`` (the session's temporary
    directory, if it was put inside the checkout)."""
    found: set[str] = set()
    skipped = os.path.realpath(skip) if skip is not None else None
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not _left_out(d)
                      and os.path.realpath(os.path.join(directory, d)) != skipped]
        relative = os.path.relpath(directory, root)
        prefix = "" if relative == "." else relative.replace(os.sep, "/") + "/"
        found.update(prefix + name for name in (*subdirs, *files) if not _left_out(name))
    return frozenset(found)


def created(before: frozenset[str], after: frozenset[str]) -> list[str]:
    """The paths in ``after`` and not in ``before``, a new directory named once
    (not each file inside it), sorted."""
    new = after - before
    return sorted(p for p in new if not any(parent in new for parent in _parents(p)))


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class CheckoutGuard:
    """A pytest plugin for the process that runs the session (pytest-xdist's
    controller): the session fails (exit status 1, one line naming them) when
    it ends with paths under ``root`` that were not there when it started."""

    def __init__(self, root: Path):
        self.root = root
        self.before: frozenset[str] = frozenset()
        self.left: list[str] = []

    def pytest_sessionstart(self, session) -> None:
        self.before = snapshot(self.root, session.config.option.basetemp)

    def pytest_sessionfinish(self, session) -> None:
        self.left = created(self.before, snapshot(self.root, session.config.option.basetemp))
        if self.left:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.left:
            terminalreporter.write_line(
                f"FAILED: the tests left {len(self.left)} new path(s) in the checkout "
                f"{self.root}: {', '.join(self.left)}; a test writes under its tmp_path, "
                "never into the repository", red=True, bold=True)
