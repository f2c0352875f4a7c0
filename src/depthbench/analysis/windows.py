"""Held-out token windows for the analyses: the run's validation split."""

from __future__ import annotations

import numpy as np

from depthbench.config import ConfigError


def held_out_windows(run, n: int, seq_len: int, path: str | None = None) -> np.ndarray:
    """``n`` evenly spaced windows of ``seq_len`` tokens from ``path`` (a 1-D token
    .npy, ``--val-tokens``) or else the run's validation split (``config.json``'s
    ``resolved.tokenizer.val_tokens_path``): int32 ``[n, seq_len]``.  The loss
    inside a window predicts its last ``seq_len - 1`` tokens, as the original
    benchmark's chunks do."""
    if n < 1 or seq_len < 2:
        raise ConfigError(f"--windows/--seq-len: need >= 1 window of >= 2 tokens, got {n} x "
                          f"{seq_len}")
    field = "--val-tokens"
    if not path:
        field = "resolved.tokenizer.val_tokens_path"
        path = str((run.resolved.get("tokenizer") or {}).get("val_tokens_path") or "")
    if not path:
        raise ConfigError(f"RUN_DIR: {run.run_dir} records no validation tokens "
                          "(resolved.tokenizer.val_tokens_path); give --val-tokens FILE.npy")
    from depthbench.data import token_cache

    tokens = token_cache.open_tokens(path, field=field)
    available = len(tokens) // seq_len
    if available < n:
        raise ConfigError(f"--windows: the validation split ({len(tokens)} tokens) holds only "
                          f"{available} windows of {seq_len} tokens; ask for fewer")
    starts = np.linspace(0, len(tokens) - seq_len, n).astype(np.int64)
    rows = np.asarray(tokens[starts[:, None] + np.arange(seq_len)], np.int32)
    if rows.max() >= run.spec.vocab_size:
        raise ConfigError(f"{field}: token ids reach {rows.max()}, "
                          f"beyond the model's vocabulary {run.spec.vocab_size}")
    return rows
