"""Corpora: where documents come from, behind one small interface.

A text corpus yields documents (``str``), a token corpus 1-D integer arrays
without their EOS (the corpora: docs/DATA.md, "Corpora").  Each has a
``fingerprint`` that changes whenever its content may have (files, sizes,
modification times, reading options), which keys everything cached from it."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from depthbench.data import cache, micro, readers, token_cache
from depthbench.errors import ConfigError

CORPORA = ("micro", "text", "jsonl", "tokens")
# In the jsonl corpus's cache key.  2: empty and null documents skipped, as
# data tokenize skips them (1 added an EOS-only document for an empty one).
JSONL_RULES = 2


def resolve_paths(paths: str, field: str = "data.paths") -> list[Path]:
    """Expand comma-separated files and globs; every entry must name at least one file."""
    entries = [p.strip() for p in str(paths).split(",") if p.strip()]
    if not entries:
        raise ConfigError(f"config.{field}: empty; give comma-separated files or globs")
    out: list[Path] = []
    for entry in entries:
        expanded = os.path.expanduser(entry)
        if glob.has_magic(expanded):
            matches = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
            if not matches:
                raise ConfigError(f"config.{field}: {entry!r} matches no file")
            out.extend(Path(m) for m in matches)
        elif os.path.isdir(expanded):
            raise ConfigError(
                f"config.{field}: {entry!r} is a directory; give a glob such as {entry}/*.txt"
            )
        elif not os.path.isfile(expanded):
            raise ConfigError(f"config.{field}: file {entry!r} does not exist")
        else:
            out.append(Path(expanded))
    return list(dict.fromkeys(p.resolve() for p in out))  # de-duplicated, order kept


def _files_fingerprint(files: list[Path]) -> list:
    out = []
    for f in files:
        st = f.stat()
        out.append([str(f), st.st_size, st.st_mtime_ns])
    return out


class TextCorpus:
    """Plain-text files: a document per file, or per blank-line-separated paragraph."""

    kind = "text"

    def __init__(self, files: list[Path], split_by: str = "file"):
        self.files, self.split_by = files, split_by
        self.name = "text"

    def fingerprint(self) -> str:
        return cache.digest("text", self.split_by, _files_fingerprint(self.files))

    def describe(self) -> str:
        return f"text: {len(self.files)} file(s), a document per {self.split_by}"

    def documents(self) -> Iterator[str]:
        for path in self.files:
            yield from readers.text_documents(path, self.split_by)


class JsonlCorpus:
    """JSON-lines files; each line's ``text_field`` is a document."""

    kind = "text"

    def __init__(self, files: list[Path], text_field: str = "text", name: str = "jsonl"):
        self.files, self.text_field, self.name = files, text_field, name

    def fingerprint(self) -> str:
        return cache.digest("jsonl", JSONL_RULES, self.text_field,
                            _files_fingerprint(self.files))

    def describe(self) -> str:
        return f"jsonl: {len(self.files)} file(s), field {self.text_field!r}"

    def documents(self) -> Iterator[str]:
        for path in self.files:
            for text, _ in readers.jsonl_documents(path, self.text_field):
                yield text


class MicroCorpus(JsonlCorpus):
    """The bundled micro corpus (fetched and cleaned once per cache)."""

    def __init__(self, root: Path, *, log=print):
        self.documents_path = micro.ensure(root, log=log)
        super().__init__([self.documents_path], "text", name="micro")
        self.key = self.documents_path.parent.name

    def fingerprint(self) -> str:
        return cache.digest("micro", self.key)  # content-addressed already

    def describe(self) -> str:
        return f"micro: Wikipedia summaries + Shakespeare ({self.documents_path})"


class TokenShards:
    """Pre-tokenised ``.npy`` shards; documents end at ``eos_id``."""

    kind = "tokens"

    def __init__(self, files: list[Path], dtype: str, eos_id: int):
        self.files, self.dtype, self.eos_id = files, np.dtype(dtype), eos_id
        self.name = "tokens"
        # Open every shard now: a corrupt or mistyped one fails before any work.
        self.shards = [
            token_cache.open_tokens(f, field="data.paths", dtype=self.dtype) for f in files
        ]
        if sum(len(s) for s in self.shards) == 0:
            raise ConfigError(f"config.data.paths: the {len(files)} shard(s) hold no tokens")

    def fingerprint(self) -> str:
        return cache.digest("tokens", str(self.dtype), self.eos_id, _files_fingerprint(self.files))

    def describe(self) -> str:
        return f"tokens: {len(self.files)} shard(s) of {self.dtype}, EOS {self.eos_id}"

    def max_id(self) -> int:
        return max(int(s.max()) for s in self.shards if len(s))

    def documents(self) -> Iterator[np.ndarray]:
        """The shards, in order, read as one stream: a document without its EOS at the
        end of a shard continues in the next (``data tokenize`` cuts fixed-size shards)."""
        carry: list[np.ndarray] = []
        for shard in self.shards:
            ends = np.flatnonzero(shard == self.eos_id)
            start = 0
            for end in ends.tolist():
                doc = np.concatenate([*carry, shard[start:end]]) if carry else shard[start:end]
                carry = []
                if len(doc):
                    yield doc
                start = end + 1
            if start < len(shard):
                carry.append(shard[start:])
        if carry:
            yield np.concatenate(carry)


def from_config(config, root: Path, *, eos_id: int | None = None, log=print):
    """The corpus ``config.data`` names (paths resolved, shards opened).

    ``eos_id`` overrides ``data.eos_id`` for token shards (prepare resolves
    -1 to the given tokenizer's EOS).
    """
    d = config.data
    if d.corpus == "micro":
        return MicroCorpus(root, log=log)
    files = resolve_paths(d.paths)
    if d.corpus == "text":
        return TextCorpus(files, d.split_by)
    if d.corpus == "jsonl":
        return JsonlCorpus(files, d.text_field)
    if d.corpus == "tokens":
        return TokenShards(files, d.tokens_dtype, d.eos_id if eos_id is None else eos_id)
    raise ConfigError(f"config.data.corpus: {d.corpus!r} is not one of {', '.join(CORPORA)}")
