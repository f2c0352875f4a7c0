"""The abstract :class:`Tokenizer` every tokenizer file is read as (the policy it
keeps on special tokens: :mod:`depthbench.data.tokenizer`)."""

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
