"""Reading files of a directory someone else made, without leaving it.

A checkpoint, a Hugging Face folder or a run directory may come from anyone,
and every name it holds is theirs: a ``tokenizer.json`` that is a symbolic
link to ``/proc/self/environ``, an index naming ``../../.ssh/id_rsa``.  Every
reader of such a directory finds its files through here: a file is read only
if it is a regular file (not a link, not a device or a FIFO) reached from
the directory by names that are neither links nor ``..``, so what a reader
reads, and what an export copies out, is what the directory itself holds.
The directory given on the command line is the user's own choice and is
resolved as given.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from depthbench.errors import ConfigError


def member(root: Path, name: str | os.PathLike, field: str) -> Path:
    """``root/name``: ConfigError (naming ``field``) unless ``name`` is a relative
    path of plain components (no ``..``, not absolute) none of which is a
    symbolic link.  The file need not exist."""
    text = str(name)
    parts = PurePosixPath(text.replace("\\", "/")).parts
    if not text or PurePosixPath(text).is_absolute() or any(p in ("..", "") for p in parts):
        raise ConfigError(f"{field}: {text!r} is not a path inside {root}; a file must be named "
                          "relative to it, without '..'")
    path = root
    for part in parts:
        if part == ".":
            continue
        path = path / part
        if path.is_symlink():
            raise ConfigError(f"{field}: {path} is a symbolic link; links are not followed out "
                              "of a directory someone else made (copy the file in)")
    return path


def is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file itself (a link to one is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def regular_file(root: Path, name: str | os.PathLike, field: str) -> Path | None:
    """``root/name`` if it is a regular file inside ``root`` (:func:`member`), None
    if absent; ConfigError if it is something else (a link, a directory, a
    device)."""
    path = member(root, name, field)
    if not os.path.lexists(path):
        return None
    if not is_regular(path):
        raise ConfigError(f"{field}: {path} is not a regular file")
    return path


def read_bytes(path: Path, limit: int, field: str) -> bytes:
    """The bytes of the regular file ``path``, refused (ConfigError) past ``limit``
    bytes before anything is read."""
    if not is_regular(path):
        raise ConfigError(f"{field}: {path} is not a regular file")
    size = os.lstat(path).st_size
    if size > limit:
        raise ConfigError(f"{field}: {path} holds {size:,} bytes; at most {limit:,} are read")
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while read
        raise ConfigError(f"{field}: {path} holds more than {limit:,} bytes")
    return data
