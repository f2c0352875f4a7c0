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


def tiny_run_overrides(root: Path, steps: int, every: int, *, n_docs: int = 300,
                       **changes: object) -> list[str]:
    """Config overrides of a 2-block, d_model-32 model trained for ``steps``
    steps on a progressions shard of ``n_docs`` documents written into ``root``
    (evaluation, checkpoints and per-block statistics every ``every`` steps).

    ``changes`` replace fields of the model, data or train section by name
    (``depth=4``, ``layer_stats_every=0``); a field set to None is left out,
    so the spec's default applies."""
    write_progressions(root / "shard.npy", n_docs)
    shape = {"suite": "", "d_model": 32, "d_ff": 64, "depth": 2, "n_heads": 2, "vocab_size": 64,
             "remat_policy": "none"}
    data = {"corpus": "tokens", "paths": root / "shard.npy", "eos_id": 0, "val_fraction": 0.1,
            "val_windows": 4, "cache_dir": root / "cache"}
    train = {"steps": steps, "batch_size": 4, "seq_len": 16, "lr": 1e-2, "log_every": 1,
             "eval_every": every, "checkpoint_every": every, "layer_stats_every": every}
    sections = (("model", shape), ("data", data), ("train", train))
    for key, value in changes.items():
        section = next((fields for _, fields in sections if key in fields), None)
        if section is None:
            raise KeyError(f"tiny_run_overrides: no field {key!r} in model, data or train")
        section[key] = value
    return [f"{name}.{key}={value}" for name, fields in sections
            for key, value in fields.items() if value is not None]
