"""Validation of the ``data`` section without reading the corpus (called by
``prepare``, the trainer and the CLI); what needs the data itself is
``prepare``'s.  Every problem is a ``ConfigError`` naming the field."""

from __future__ import annotations

import math
import os

from depthbench.data import corpora, readers, spm_tokenizer
from depthbench.errors import ConfigError

TOKEN_DTYPES = ("uint16", "uint32")


def _int(config, dotted: str, *, lo: int, hi: int | None = None) -> int:
    section, field = dotted.split(".")
    value = config[section][field]
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError(f"config.{dotted}: must be an integer {bound}, got {value!r}")
    return value


def _choice(value, dotted: str, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"config.{dotted}: {value!r} is not one of {', '.join(allowed)}")


def validate_config(config, *, files: bool = True) -> None:
    """Raise one ConfigError for the first bad ``data`` field (or data-related train field).

    ``files=False`` skips what depends on this host's files (paths matching,
    a tokenizer file existing) but still refuses an empty ``data.paths``: for
    listing runs that will read files on other machines."""
    d = config.data
    _choice(d.corpus, "data.corpus", corpora.CORPORA)
    _choice(d.split_by, "data.split_by", readers.SPLIT_BY)
    _choice(d.tokens_dtype, "data.tokens_dtype", TOKEN_DTYPES)
    f = d.val_fraction
    if (
        isinstance(f, bool)
        or not isinstance(f, (int, float))
        or not (math.isfinite(f) and 0 < f < 1)
    ):
        raise ConfigError(f"config.data.val_fraction: must be a number in (0, 1), got {f!r}")
    _int(config, "data.shuffle_seed", lo=0, hi=2**32 - 1)
    _int(config, "data.prefetch", lo=0)
    _int(config, "data.worker_count", lo=0)
    _int(config, "data.val_windows", lo=1)
    _int(config, "data.tokenizer_sample_bytes", lo=1)
    _int(config, "data.eos_id", lo=-1)
    _int(config, "model.vocab_size", lo=2)
    _int(config, "train.seq_len", lo=1)
    _int(config, "train.batch_size", lo=1)
    if d.corpus != "micro":
        if files:
            corpora.resolve_paths(d.paths)
        elif not str(d.paths).strip(" ,"):
            raise ConfigError("config.data.paths: empty; give comma-separated files or globs")
    if d.corpus == "jsonl" and not str(d.text_field):
        raise ConfigError("config.data.text_field: empty; name the JSON field holding the text")
    if files and d.tokenizer and os.path.isdir(os.path.expanduser(d.tokenizer)):
        raise ConfigError(f"config.data.tokenizer: {d.tokenizer!r} is a directory, not a "
                          "tokenizer file (a tokenizer.json or a SentencePiece .model)")
    if files and d.tokenizer and not os.path.isfile(os.path.expanduser(d.tokenizer)):
        raise ConfigError(f"config.data.tokenizer: file {d.tokenizer!r} does not exist")
    if d.eos_id >= config.model.vocab_size:
        raise ConfigError(
            f"config.data.eos_id: {d.eos_id} is not below model.vocab_size "
            f"{config.model.vocab_size}"
        )
    if d.corpus == "tokens":
        if not d.tokenizer and d.eos_id < 0:
            raise ConfigError(
                "config.data.eos_id: token shards need the id separating documents "
                "(or give data.tokenizer to use its EOS)"
            )
    elif not d.tokenizer:
        spm_tokenizer.check_trainable(config.model.vocab_size)
