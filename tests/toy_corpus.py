"""A tiny token corpus that a model learns within a few steps, for trainer tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_progressions(path: Path, n_docs: int) -> None:
    """``n_docs`` documents of arithmetic progressions mod 63 (ids 1..63), each
    followed by EOS = 0, saved as one uint16 token shard (seed 0: the same file
    every time)."""
    rng = np.random.default_rng(0)
    docs = []
    for _ in range(n_docs):
        start, stride, n = rng.integers(0, 63), rng.integers(1, 8), rng.integers(20, 80)
        docs.append((start + stride * np.arange(n)) % 63 + 1)
        docs.append(np.zeros(1, np.int64))
    np.save(path, np.concatenate(docs).astype(np.uint16))
