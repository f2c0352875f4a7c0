"""The validation split: a document is held out by a hash of its content, so the
split needs no coordination and never moves as files are added
(docs/DATA.md, "Validation split").  Token documents are hashed as
little-endian uint32, whatever their storage dtype."""

from __future__ import annotations

import hashlib

import numpy as np

_SPLIT_SALT = b"depthbench/split"
_SAMPLE_SALT = b"depthbench/sample"


def _unit(data: bytes, salt: bytes) -> float:
    """A hash of ``data`` mapped uniformly to [0, 1)."""
    h = hashlib.blake2b(data, digest_size=8, key=salt).digest()
    return int.from_bytes(h, "little") / 2.0**64


def document_bytes(doc: str | np.ndarray) -> bytes:
    if isinstance(doc, str):
        return doc.encode("utf-8")
    return np.asarray(doc).astype("<u4", copy=False).tobytes()


def is_validation(doc: str | np.ndarray, fraction: float) -> bool:
    """Whether ``doc`` belongs to the held-out split (expected share: ``fraction``)."""
    return _unit(document_bytes(doc), _SPLIT_SALT) < fraction


def in_sample(doc: str, probability: float) -> bool:
    """Deterministic subsample (independent of the split) for tokenizer training."""
    return probability >= 1.0 or _unit(document_bytes(doc), _SAMPLE_SALT) < probability
