"""Sealing a checkpoint step and checking the seal.

Once a save is finalized, the trainer's process 0 writes
``<step>/integrity.json``: the size and SHA-256 of every file of the step.
:func:`check_integrity` says why a step no longer matches its record (bit
rot, a partial copy, a truncated or deleted file); a step without a record
(saved by a session killed before it was sealed) is left to the reader.

A run directory may come from someone else, so the record is read as
untrusted input (:func:`depthbench.rundir.io.read_json`'s bounds, then
field by field: ``{"files": {relative path: [size, sha256]}}``), every path
it names must lie inside the step (:func:`depthbench.confine.member`), and a
step holding anything but directories and regular files (a link out of it,
a FIFO, a device) is not intact, record or not: a reader reads only what
the step itself holds.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from depthbench import confine
from depthbench.digest import file_sha256
from depthbench.errors import ConfigError
from depthbench.rundir.io import DamagedFile, read_json
from depthbench.rundir.names import INTEGRITY_FILE

_SHA256 = re.compile(r"[0-9a-f]{64}")


def integrity_record(step_dir: Path) -> dict:
    """``{"files": {relative path: [size, sha256]}}`` of every file under ``step_dir``."""
    files = {}
    for p in sorted(step_dir.rglob("*")):
        if p.is_file() and p.name != INTEGRITY_FILE:
            files[p.relative_to(step_dir).as_posix()] = [p.stat().st_size, file_sha256(p)]
    return {"files": files}


def write_integrity(step_dir: Path) -> None:
    """Seal a finalized step (atomically: a torn record would condemn a good step)."""
    record = integrity_record(step_dir)
    tmp = step_dir / f".{INTEGRITY_FILE}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=0) + "\n")
    os.replace(tmp, step_dir / INTEGRITY_FILE)


def foreign_entry(step_dir: Path) -> str | None:
    """The first thing under ``step_dir`` that is neither a directory nor a regular
    file (links are not followed), relative to it; None if there is none."""
    for root, dirs, files in os.walk(step_dir):
        for name in sorted(dirs + files):
            path = Path(root) / name
            mode = os.lstat(path).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                return f"{path.relative_to(step_dir).as_posix()} is {kind}"
    return None


def _record(step_dir: Path) -> dict[str, tuple[int, str]] | str | None:
    """The step's record, checked field by field: ``{relative path: (size,
    sha256)}``; a string saying what is wrong with it; None without one."""
    try:
        data = read_json(step_dir / INTEGRITY_FILE)
    except DamagedFile as e:
        return f"{INTEGRITY_FILE} {e.reason}"
    if data is None:
        return None
    files = data.get("files")
    if not isinstance(files, dict):
        return f"{INTEGRITY_FILE}: files must be an object of path -> [size, sha256]"
    out = {}
    for rel, entry in files.items():
        if not (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int
                and entry[0] >= 0 and isinstance(entry[1], str) and _SHA256.fullmatch(entry[1])):
            return (f"{INTEGRITY_FILE}: files[{rel[:80]!r}] must be [size, sha256] (a "
                    "non-negative integer and 64 hex digits)")
        out[rel] = (entry[0], entry[1])
    return out


def check_integrity(step_dir: Path) -> str | None:
    """Why ``step_dir`` does not match its integrity record, or holds something
    other than directories and regular files (None: it matches, or it has no
    record to check against and holds only those)."""
    foreign = foreign_entry(step_dir)
    if foreign is not None:
        return foreign
    files = _record(step_dir)
    if not isinstance(files, dict):
        return files
    for rel, (size, digest) in files.items():
        try:
            p = confine.member(step_dir, rel, INTEGRITY_FILE)
        except ConfigError:
            return f"{INTEGRITY_FILE} names {rel[:80]!r}, which is not a path inside the step"
        if not confine.is_regular(p):
            return f"{rel} is missing"
        actual = p.stat().st_size
        if actual != size:
            return f"{rel} has {actual} bytes, not {size}"
        if file_sha256(p) != digest:
            return f"{rel} does not match its recorded SHA-256"
    return None
