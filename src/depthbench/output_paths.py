"""Paths a command will write, checked before any work starts.

A command that trains for minutes and then finds its ``--out`` is a folder, or
that meets a symbolic-link loop as a ``RuntimeError`` from deep inside a
writer, has wasted the work and printed a traceback.  Every output path goes
through here first, links resolved: one :class:`ConfigError` naming the
option (or environment variable) and what is allowed, exit status 2, nothing
written.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from depthbench.errors import ConfigError

__all__ = ["LOOP", "link_loop", "output_file", "resolve"]


LOOP = "is a symbolic-link loop; give a path whose links end somewhere"


def link_loop(path: str | Path) -> bool:
    """Whether resolving ``path`` runs into a link loop (Python raises RuntimeError
    for it up to 3.12 and OSError after, or stops at the loop and leaves it to
    the first write)."""
    try:
        os.stat(Path(path).expanduser().resolve())
    except RuntimeError:
        return True
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def resolve(path: str | Path, field: str) -> Path:
    """``path`` with ``~`` expanded and links resolved; a loop is one ConfigError."""
    if link_loop(path):
        raise ConfigError(f"{field}: {str(path)!r} {LOOP}")
    return Path(path).expanduser().resolve()


def output_file(path: str | Path, field: str) -> Path:
    """A file the command will write (an existing file is replaced): links
    resolved, not a directory, in a directory that exists."""
    if not str(path).strip():
        raise ConfigError(f"{field}: expected a file name, got ''")
    out = resolve(path, field)
    if out.is_dir():
        raise ConfigError(f"{field}: {str(path)!r} is a directory; give a file name (a new "
                          "file, or one to replace)")
    parent = out.parent
    if not parent.is_dir():
        existing = next((p for p in parent.parents if p.exists()), None)
        if parent.exists() or (existing is not None and not existing.is_dir()):
            blocker = parent if parent.exists() else existing
            raise ConfigError(f"{field}: {str(path)!r}: {str(blocker)!r} is a file, not a "
                              "directory")
        raise ConfigError(f"{field}: directory {str(parent)!r} does not exist; create it first")
    return out
