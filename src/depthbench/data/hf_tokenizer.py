"""A Hugging Face ``tokenizer.json`` with the interface of depthbench's SentencePiece
:class:`~depthbench.data.spm_tokenizer.Tokenizer` (``encode``, ``decode``,
``eos_id``, ``bos_id``, ``vocab_size``), for runs made by ``import-hf``.

Read with the ``tokenizers`` library (no transformers).  Special tokens come
from ``tokenizer_config.json`` beside the file when present (what
``PreTrainedTokenizerFast`` would use), else from the ids the checkpoint's
``config.json`` recorded, else from common EOS spellings.  ``encode`` adds no
special tokens unless asked (as the original benchmark's evaluation encodes);
``bos_id`` is -1 when the tokenizer has none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from depthbench.errors import ConfigError

EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eot_id|>")


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer:
    kind = "huggingface"

    def __init__(self, path: str | Path, *, eos_id: int = -1, bos_id: int = -1,
                 field: str = "resolved.tokenizer.tokenizer_path"):
        from tokenizers import Tokenizer

        self.path = str(path)
        if not Path(path).is_file():
            raise ConfigError(f"{field}: file {self.path!r} does not exist")
        try:
            self.tok = Tokenizer.from_file(self.path)
        except Exception as e:  # the library raises a bare Exception on bad JSON
            raise ConfigError(f"{field}: {self.path} is not a tokenizer.json "
                              f"({str(e).splitlines()[0][:100] if str(e) else e!r})") from None
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        named = self._config_tokens(Path(path).with_name("tokenizer_config.json"))
        self.eos_id = self._resolve(named.get("eos_token"), eos_id, EOS_CANDIDATES)
        self.bos_id = self._resolve(named.get("bos_token"), bos_id, ())
        pad = self._resolve(named.get("pad_token"), -1, ())
        self.pad_id = pad if pad >= 0 else self.eos_id
        if self.eos_id < 0:
            raise ConfigError(f"{field}: {self.path} has no EOS token (none named in "
                              f"tokenizer_config.json, none of {', '.join(EOS_CANDIDATES)})")

    @staticmethod
    def _config_tokens(path: Path) -> dict[str, str]:
        if not path.is_file():
            return {}
        try:
            cfg = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return {k: t for k in ("eos_token", "bos_token", "pad_token")
                if (t := _token_text(cfg.get(k))) is not None}

    def _resolve(self, text: str | None, given: int, candidates: Iterable[str]) -> int:
        for name in ([text] if text else []) + list(candidates if given < 0 else []):
            token_id = self.tok.token_to_id(name)
            if token_id is not None:
                return int(token_id)
        return int(given)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts, num_threads: int = 0) -> list[list[int]]:
        del num_threads
        return [list(e.ids) for e in self.tok.encode_batch(list(texts),
                                                           add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def describe(self) -> str:
        return (f"{Path(self.path).name} (vocab {self.vocab_size}, bos {self.bos_id}, "
                f"eos {self.eos_id})")


def open_tokenizer(path: str | Path, *, field: str, eos_id: int = -1, bos_id: int = -1):
    """The tokenizer at ``path``: a Hugging Face ``tokenizer.json`` (by its
    ``.json`` suffix) or a SentencePiece ``.model``, both with ``encode``,
    ``encode_batch``, ``decode``, ``eos_id``, ``bos_id``, ``pad_id`` and
    ``vocab_size``.  ``eos_id``/``bos_id`` >= 0 name the special ids a
    tokenizer.json does not (token shards record their EOS id, not its text);
    ``field`` names the setting in error messages."""
    if str(path).endswith(".json"):
        return HFTokenizer(path, eos_id=eos_id, bos_id=bos_id, field=field)
    from depthbench.data import spm_tokenizer

    return spm_tokenizer.Tokenizer(path, field=field)
