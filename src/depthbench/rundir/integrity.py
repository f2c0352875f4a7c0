"""Sealing a checkpoint step and checking the seal.

Once a save is finalized, the trainer's process 0 writes
``<step>/integrity.json``: the size and SHA-256 of every file of the step.
:func:`check_integrity` says why a step no longer matches its record (bit
rot, a partial copy, a truncated or deleted file); a step without a record
(saved by a session killed before it was sealed) is left to the reader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from depthbench.digest import file_sha256
from depthbench.rundir.names import INTEGRITY_FILE


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


def check_integrity(step_dir: Path) -> str | None:
    """Why ``step_dir`` does not match its integrity record (None: it matches,
    or it has no record to check against)."""
    path = step_dir / INTEGRITY_FILE
    if not path.exists():
        return None
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{INTEGRITY_FILE} is unreadable ({e})"
    for rel, (size, digest) in files.items():
        p = step_dir / rel
        if not p.is_file():
            return f"{rel} is missing"
        actual = p.stat().st_size
        if actual != size:
            return f"{rel} has {actual} bytes, not {size}"
        if file_sha256(p) != digest:
            return f"{rel} does not match its recorded SHA-256"
    return None
