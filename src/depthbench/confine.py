"""Reading files of a directory someone else made, without leaving it, within bounds.

A checkpoint, a Hugging Face folder or a run directory may come from anyone,
and every name it holds is theirs: a ``tokenizer.json`` that is a symbolic
link to ``/proc/self/environ``, an index naming ``../../.ssh/id_rsa``, a
``config.json`` of a gigabyte.  Every reader of such a directory finds its
files through here: a file is read only if it is a regular file (not a link,
not a device or a FIFO) reached from the directory by names that are neither
links nor ``..``, so what a reader reads, and what an export copies out, is
what the directory itself holds; and a file is read or copied only up to a
limit the caller states, checked before anything is read.  The directory
given on the command line is the user's own choice and is resolved as given.

Files are opened without following a link and checked once open
(:func:`open_regular`), so a name swapped for a link between a check and the
read is refused too.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from depthbench.errors import ConfigError

_BLOCK = 1 << 20  # bytes copied at a time: a copied file is never held whole


def member(root: Path, name: str | os.PathLike, field: str) -> Path:
    """``root/name``: ConfigError (naming ``field``) unless ``name`` is a relative
    path of plain components (no ``..``, not absolute) none of which is a
    symbolic link.  The file need not exist."""
    text = str(name)
    parts = PurePosixPath(text.replace("\\", "/")).parts
    if not text or "\0" in text or PurePosixPath(text).is_absolute() or any(
            p in ("..", "") for p in parts):
        raise ConfigError(f"{field}: {text[:200]!r} is not a path inside {root}; a file must be "
                          "named relative to it, without '..'")
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
    except (OSError, ValueError):
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


class Unreadable(ConfigError):
    """A file a reader will not read: ``path`` and ``reason`` (what it is: a link,
    not a regular file, too big), after the ``field`` that named it."""

    def __init__(self, field: str, path: Path, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"{field}: {path} {reason}")


def _too_big(path: Path, size: int, limit: int, field: str) -> Unreadable:
    return Unreadable(field, path, f"holds {size:,} bytes; at most {limit:,} are read")


@contextlib.contextmanager
def open_regular(path: Path, field: str, limit: int | None = None) -> Iterator[BinaryIO]:
    """``path`` open for reading if it is a regular file itself (opened without
    following a link, then checked: no FIFO that blocks, no device that never
    ends) of at most ``limit`` bytes; ConfigError naming ``field`` otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        why = ("is a symbolic link; links are not followed (copy the file in)"
               if os.path.islink(path) else f"cannot be read ({e.strerror})")
        raise Unreadable(field, path, why) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(field, path, "is not a regular file")
        if limit is not None and info.st_size > limit:
            raise _too_big(path, info.st_size, limit, field)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def read_bytes(path: Path, limit: int, field: str) -> bytes:
    """The bytes of the regular file ``path``, refused (ConfigError) past ``limit``
    bytes before anything is read."""
    with open_regular(path, field, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while read
        raise _too_big(path, len(data), limit, field)
    return data


def copy_file(src: Path, dest: Path, limit: int, field: str) -> None:
    """Copy the regular file ``src`` to the new file ``dest`` in blocks, refused
    (ConfigError) past ``limit`` bytes: what an import or an export copies out
    of a directory someone else made."""
    with open_regular(src, field, limit) as f, open(dest, "xb") as out:
        copied = 0
        while block := f.read(_BLOCK):
            copied += len(block)
            if copied > limit:  # grew while copied
                raise _too_big(src, copied, limit, field)
            out.write(block)
