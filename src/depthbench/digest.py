"""The SHA-256 of a file's bytes, streamed: the one file digest of the package
(integrity records, tokenizer identity, the micro corpus's archives).  Imports
nothing of depthbench, so data/ and train/ may both import it."""

from __future__ import annotations

import hashlib
from pathlib import Path

_BLOCK_BYTES = 1 << 20  # read in blocks: a file is never held whole in memory


def file_sha256(path: str | Path) -> str:
    """The hex SHA-256 of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK_BYTES), b""):
            h.update(block)
    return h.hexdigest()
