"""Data: corpora, tokenizers, the tokenised cache and the grain pipeline.

The trainer's view::

    prepared = data.prepare(config)              # cached; raises ConfigError on bad input
    it = data.train_iterator(config, prepared)   # infinite host-local batches
    val = data.val_batches(config, prepared)     # fixed list of host-local batches
    ckpt_args = ocp.args.Composite(state=..., data=data.checkpoint_save_arg(it))

Batches are ``{"inputs": int32 [B_host, T], "targets": int32 [B_host, T]}``.
See docs/DATA.md for the corpora, their licences and the cache layout.
"""

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
