"""Data: corpora, tokenizers, the tokenised cache and the grain pipeline.

The trainer calls ``prepare(config)`` (cached), ``train_iterator`` (infinite
host-local batches ``{"inputs", "targets"}: int32 [B_host, T]``),
``val_batches`` and ``checkpoint_save_arg``.  docs/DATA.md has the rest."""

from depthbench.data.cache import cache_root
from depthbench.data.pipeline import (
    checkpoint_restore_arg,
    checkpoint_save_arg,
    train_dataset,
    train_iterator,
    val_batches,
    window_count,
)
from depthbench.data.prepare import Prepared, prepare, tokenizer
from depthbench.data.tokenizer import Tokenizer, open_tokenizer
from depthbench.data.validate import validate_config

__all__ = [
    "Prepared",
    "Tokenizer",
    "cache_root",
    "checkpoint_restore_arg",
    "checkpoint_save_arg",
    "open_tokenizer",
    "prepare",
    "tokenizer",
    "train_dataset",
    "train_iterator",
    "val_batches",
    "validate_config",
    "window_count",
]
