"""The one tokenizer interface over a SentencePiece model and a Hugging Face tokenizer.json.

Every consumer opens tokenizers through :func:`open_tokenizer`: ``data
prepare`` (a given tokenizer), ``data tokenize``, ``data show``, the analyses,
``depthbench eval`` and the lm-eval backend (through the run's tokenizer).

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

import abc
import functools
from collections.abc import Iterable, Sequence
from pathlib import Path

from depthbench.digest import file_sha256
from depthbench.errors import ConfigError


class Tokenizer(abc.ABC):
    """A loaded tokenizer file: ``encode``/``decode`` and its special ids (-1: none).

    Picklable (worker processes reload it from its path with the same arguments).
    """

    kind: str  # "sentencepiece" | "huggingface"
    path: str
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int
    adds_specials_by_default: bool = False

    def __init__(self, path: str | Path, field: str, **options):
        self.path, self.field = str(path), field
        self._options = options
        if Path(path).is_dir():
            raise ConfigError(f"{field}: {self.path!r} is a directory, not a tokenizer file")
        if not Path(path).is_file():
            raise ConfigError(f"{field}: file {self.path!r} does not exist")

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str], num_threads: int = 2) -> list[list[int]]:
        """Each text's ids, no special tokens added.  ``num_threads``: SentencePiece's
        threads for this call (the tokenizers library takes its own from
        ``RAYON_NUM_THREADS``)."""

    @abc.abstractmethod
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``."""

    @abc.abstractmethod
    def token_text(self, token_id: int) -> str:
        """The vocabulary entry of one id (``</s>``, ``<|endoftext|>``)."""

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    @functools.cached_property
    def sha256(self) -> str:
        """The file's SHA-256: which tokenizer made a cache entry or a shard."""
        return file_sha256(self.path)

    def describe(self) -> str:
        """One line for logs."""
        return (f"{Path(self.path).name} ({self.kind}, vocab {self.vocab_size}, "
                f"bos {self.bos_id}, eos {self.eos_id}, pad {self.pad_id})")

    def record(self) -> dict:
        """What a manifest records about the tokenizer that made its tokens."""
        return {"path": str(Path(self.path).resolve()), "kind": self.kind, "sha256": self.sha256,
                "vocab_size": self.vocab_size, "eos_id": self.eos_id,
                "eos_token": self.token_text(self.eos_id)}

    def __getstate__(self):
        return {"path": self.path, "field": self.field, "options": self._options}

    def __setstate__(self, state):
        self.__init__(state["path"], field=state["field"], **state["options"])


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
        from depthbench.data.hf_tokenizer import HFTokenizer

        return HFTokenizer(path, field=field, eos_id=eos_id, bos_id=bos_id, eos_token=eos_token)
    if eos_token:
        raise ConfigError("--eos-token: only for tokenizer.json files; a SentencePiece "
                          "model's EOS is its own eos_id")
    from depthbench.data.spm_tokenizer import SentencePieceTokenizer

    return SentencePieceTokenizer(path, field=field)
