"""The one tokenizer interface over a SentencePiece model and a Hugging Face tokenizer.json.

Every consumer opens tokenizers through :func:`open_tokenizer`, with one
special-token policy (``encode`` adds none), so a corpus tokenised by one
command and scored by another gives the same ids (docs/DATA.md, "Tokenizers
and special tokens")."""

from __future__ import annotations

from pathlib import Path

from depthbench.data.hf_tokenizer import HFTokenizer
from depthbench.data.spm_tokenizer import SentencePieceTokenizer
from depthbench.data.tokenizer_base import Tokenizer
from depthbench.errors import ConfigError

__all__ = ["HFTokenizer", "SentencePieceTokenizer", "Tokenizer", "open_tokenizer"]


def open_tokenizer(path: str | Path, *, field: str, eos_id: int = -1, bos_id: int = -1,
                   eos_token: str = "") -> Tokenizer:
    """The tokenizer at ``path``: a Hugging Face ``tokenizer.json`` (by its ``.json``
    suffix) or a SentencePiece model (anything else).

    ``eos_id``/``bos_id`` >= 0 name special ids a tokenizer.json does not (token
    shards record their EOS id, not its text); ``eos_token`` names a
    tokenizer.json's EOS by its text (``data tokenize --eos-token``); ``field``
    names the setting in error messages.
    """
    if str(path).endswith(".json"):
        return HFTokenizer(path, field=field, eos_id=eos_id, bos_id=bos_id, eos_token=eos_token)
    if eos_token:
        raise ConfigError("--eos-token: only for tokenizer.json files; a SentencePiece "
                          "model's EOS is its own eos_id")
    return SentencePieceTokenizer(path, field=field)
