"""A Hugging Face ``tokenizer.json`` as a :class:`~depthbench.data.tokenizer_base.Tokenizer`.

Read with the ``tokenizers`` library (no transformers); ``encode`` adds no
special tokens.  Where its EOS, BOS and pad ids come from: docs/DATA.md,
"Tokenizers and special tokens"."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from depthbench.data.tokenizer_base import Tokenizer
from depthbench.errors import ConfigError

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>")


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _config_tokens(path: Path) -> dict[str, str]:
    """``eos_token`` / ``bos_token`` / ``pad_token`` of a tokenizer_config.json, if readable."""
    if not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    return {k: t for k in ("eos_token", "bos_token", "pad_token")
            if (t := _token_text(cfg.get(k))) is not None}


class HFTokenizer(Tokenizer):
    kind = "huggingface"

    def __init__(self, path: str | Path, *, field: str, eos_id: int = -1, bos_id: int = -1,
                 eos_token: str = ""):
        super().__init__(path, field, eos_id=eos_id, bos_id=bos_id, eos_token=eos_token)
        from tokenizers import Tokenizer as Library

        try:
            self.tok = Library.from_file(self.path)
        except Exception as e:  # the library raises a bare Exception on bad JSON
            detail = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise ConfigError(f"{field}: {self.path} is not a Hugging Face tokenizer.json "
                              f"({detail}); give a tokenizer.json or a SentencePiece .model"
                              ) from None
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.adds_specials_by_default = self.tok.num_special_tokens_to_add(False) > 0
        # encode_batch_fast (tokenizers >= 0.21) skips the offsets we do not use.
        self._encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        named = _config_tokens(Path(path).with_name("tokenizer_config.json"))
        if eos_token:
            self.eos_id = self._id(eos_token)
            if self.eos_id < 0:
                raise ConfigError(f"--eos-token: {eos_token!r} is not in {self.path}'s vocabulary")
        else:
            self.eos_id = self._resolve(named.get("eos_token"), eos_id, EOS_CANDIDATES)
        if self.eos_id < 0:
            raise ConfigError(f"{field}: {self.path} has no EOS token (none named in "
                              f"tokenizer_config.json, none of {', '.join(EOS_CANDIDATES)}); "
                              "name it (data tokenize --eos-token, or data.eos_id)")
        self.bos_id = self._resolve(named.get("bos_token"), bos_id, ())
        pad = self._resolve(named.get("pad_token"), -1, ())
        self.pad_id = pad if pad >= 0 else self.eos_id

    def _id(self, text: str) -> int:
        token_id = self.tok.token_to_id(text)
        return -1 if token_id is None else int(token_id)

    def _resolve(self, named: str | None, given: int, candidates: Iterable[str]) -> int:
        """The id of ``named``, else ``given`` if >= 0, else the first candidate present."""
        if named and self._id(named) >= 0:
            return self._id(named)
        if given >= 0:
            return int(given)
        return next((self._id(c) for c in candidates if self._id(c) >= 0), -1)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 2) -> list[list[int]]:
        del num_threads  # the library's own: RAYON_NUM_THREADS
        return [list(e.ids) for e in self._encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self.tok.id_to_token(int(token_id)) or ""
