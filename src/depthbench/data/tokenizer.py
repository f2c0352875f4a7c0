"""The one tokenizer interface over a SentencePiece model and a Hugging Face tokenizer.json.

Every consumer opens tokenizers through :func:`open_tokenizer`: ``data
prepare`` (a given tokenizer), ``data tokenize``, ``data show``, the analyses,
``depthbench eval`` and the lm-eval backend (through the run's tokenizer).
Each gets a :class:`~depthbench.data.tokenizer_base.Tokenizer`: a
:class:`~depthbench.data.spm_tokenizer.SentencePieceTokenizer` or a
:class:`~depthbench.data.hf_tokenizer.HFTokenizer`.

Special tokens, one policy for all of them:

* ``encode`` and ``encode_batch`` return a text's own ids and never add
  special tokens, whatever the file would add by default (a Llama
  ``tokenizer.json`` whose post-processor prepends BOS does not prepend it
  here).  Special tokens written literally in the text (``<|endoftext|>``)
  are still recognised as the single tokens they are, as the library does.
* The data pipeline joins documents with ``eos_id`` explicitly: every
  document is its ids followed by EOS, with no BOS (``data prepare``,
  ``data tokenize``).
* Scoring code adds what it needs explicitly: the token an empty context
  is conditioned on (``evaluation.runner.prefix_token_id``) and the BOS that
  lm-eval's ``add_bos_token`` asks for.
* ``decode(ids, skip_special_tokens=False)`` renders special tokens unless
  asked not to (SentencePiece renders its control pieces, BOS, EOS and pad,
  as nothing either way).

So a corpus tokenised by one command and scored by another gives the same
ids for the same text.  ``adds_specials_by_default`` says whether the file's
own default would have added tokens (what ``data tokenize`` keys on, so
output written under the library's default is never resumed into).
"""

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
