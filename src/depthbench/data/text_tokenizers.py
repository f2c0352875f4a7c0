"""Given tokenizers for ``data tokenize``: a Hugging Face tokenizer.json or a SentencePiece model.

Both expose one interface, :class:`GivenTokenizer`: ``encode_batch(texts)``
(a list of id lists, equal to the library's own ``encode`` of each text),
``vocab_size``, ``eos_id`` and a content hash, so the tokenised shards record
exactly which tokenizer made them.

* ``tokenizer.json`` (the ``tokenizers`` library, e.g. GPT-NeoX's): ids are
  ``Tokenizer.encode(text).ids`` with the library's defaults (its
  post-processor's special tokens included, as ``encode`` adds them).  EOS is
  ``eos_token`` if given, else the first of :data:`EOS_CANDIDATES` the
  vocabulary holds (``<|endoftext|>`` is id 0 in GPT-NeoX's).
* ``*.model`` (SentencePiece): depthbench's own
  :class:`~depthbench.data.spm_tokenizer.Tokenizer` (line-by-line encoding,
  see its docstring), the same one ``data prepare`` uses; EOS is the model's.

Bad files are one :class:`~depthbench.config.ConfigError` naming ``--tokenizer``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from depthbench.config import ConfigError

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>")


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class GivenTokenizer:
    """A tokenizer file loaded for encoding (picklable: workers reload it from the path)."""

    def __init__(self, path: str | Path, eos_token: str = "", *, field: str = "--tokenizer"):
        self.path, self.eos_token_arg, self.field = str(path), eos_token, field
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{field}: file {self.path!r} does not exist")
        self.kind = "sentencepiece" if p.suffix == ".model" else "huggingface"
        self.sha256 = file_sha256(p)
        if self.kind == "sentencepiece":
            self._load_sentencepiece()
        else:
            self._load_huggingface()

    def _load_huggingface(self) -> None:
        from tokenizers import Tokenizer

        try:
            self._hf = Tokenizer.from_file(self.path)
        except Exception as e:  # the library raises a bare Exception on bad JSON
            detail = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise ConfigError(
                f"{self.field}: {self.path} is not a Hugging Face tokenizer.json ({detail}); "
                "give a tokenizer.json or a SentencePiece .model"
            ) from None
        self.vocab_size = self._hf.get_vocab_size(with_added_tokens=True)
        names = (self.eos_token_arg,) if self.eos_token_arg else EOS_CANDIDATES
        for name in names:
            token_id = self._hf.token_to_id(name)
            if token_id is not None:
                self.eos_token, self.eos_id = name, int(token_id)
                break
        else:
            if self.eos_token_arg:
                raise ConfigError(
                    f"--eos-token: {self.eos_token_arg!r} is not in {self.path}'s vocabulary"
                )
            raise ConfigError(
                f"{self.field}: {self.path} has none of the EOS tokens "
                f"{', '.join(EOS_CANDIDATES)}; name its EOS with --eos-token"
            )
        # encode_batch_fast (tokenizers >= 0.21) skips offsets we do not use.
        self._encode = getattr(self._hf, "encode_batch_fast", self._hf.encode_batch)

    def _load_sentencepiece(self) -> None:
        from depthbench.data import spm_tokenizer

        if self.eos_token_arg:
            raise ConfigError("--eos-token: only for tokenizer.json files; a SentencePiece "
                              "model's EOS is its own eos_id")
        try:
            self._spm = spm_tokenizer.Tokenizer(self.path)
        except ConfigError:
            raise ConfigError(f"{self.field}: {self.path} is not a SentencePiece model") from None
        self.vocab_size = self._spm.vocab_size
        self.eos_id = int(self._spm.eos_id)
        if self.eos_id < 0:
            raise ConfigError(f"{self.field}: {self.path} has no EOS piece")
        self.eos_token = self._spm.sp.id_to_piece(self.eos_id)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids, as the library's own ``encode`` gives them (no EOS appended)."""
        if self.kind == "sentencepiece":
            return self._spm.encode_batch(list(texts), num_threads=1)
        return [e.ids for e in self._encode(list(texts))]

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def describe(self) -> dict:
        return {"path": os.path.abspath(self.path), "kind": self.kind, "sha256": self.sha256,
                "vocab_size": self.vocab_size, "eos_id": self.eos_id, "eos_token": self.eos_token}

    def __getstate__(self):
        return {"path": self.path, "eos_token": self.eos_token_arg, "field": self.field}

    def __setstate__(self, state):
        self.__init__(state["path"], state["eos_token"], field=state["field"])
