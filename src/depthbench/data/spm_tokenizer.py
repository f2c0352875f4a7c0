"""SentencePiece tokenizers: train one on the training split, or load a given model.

Trained models round-trip exactly (BPE with byte fallback, identity
normalisation; ids 0-3 are unk, bos, eos, pad).  A model with a newline byte
piece is applied line by line, since SentencePiece trains on lines each with a
leading word boundary (docs/DATA.md, "Tokenizer")."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from depthbench.data import cache
from depthbench.data.tokenizer_base import Tokenizer
from depthbench.errors import ConfigError

UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
SPECIAL_PIECES = 4
BYTE_PIECES = 256
# SentencePiece drops training lines longer than this many bytes (its default).
MAX_TRAIN_LINE_BYTES = 4192
# Bump when training options change: the cache key includes it.
TRAINER_VERSION = 1
_NEWLINE_PIECE = "<0x0A>"
# Characters are at most 4 bytes, so chunks of MAX/4 characters always fit; prefer a space.
_CHUNK_CHARS = MAX_TRAIN_LINE_BYTES // 4
_LINE_CHUNK = re.compile(rf".{{1,{_CHUNK_CHARS}}}(?:\s|$)|.{{1,{_CHUNK_CHARS}}}")


def check_trainable(vocab_size: int) -> None:
    """A trained model needs its byte pieces and specials, plus room for merges."""
    floor = BYTE_PIECES + SPECIAL_PIECES
    if vocab_size <= floor:
        raise ConfigError(
            f"config.model.vocab_size: {vocab_size} leaves no room for merges: a trained "
            f"tokenizer has {BYTE_PIECES} byte pieces and {SPECIAL_PIECES} specials; "
            f"use more than {floor}"
        )


class SentencePieceTokenizer(Tokenizer):
    """A loaded SentencePiece model (:class:`~depthbench.data.tokenizer_base.Tokenizer`)."""

    kind = "sentencepiece"

    def __init__(self, path: str | Path, *, field: str = "config.data.tokenizer"):
        super().__init__(path, field)
        try:
            self.sp = spm.SentencePieceProcessor(model_file=self.path)
        except (RuntimeError, OSError):
            raise ConfigError(f"{field}: {self.path} is not a SentencePiece model") from None
        self.vocab_size = self.sp.get_piece_size()
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()
        self.pad_id, self.unk_id = self.sp.pad_id(), self.sp.unk_id()
        nl = self.sp.piece_to_id(_NEWLINE_PIECE)
        self.newline_id = nl if nl != self.unk_id and self.sp.is_byte(nl) else -1

    def encode_batch(self, texts: Sequence[str], num_threads: int = 2) -> list[list[int]]:
        """Token ids of each text (no BOS/EOS added)."""
        if self.newline_id < 0:
            return self.sp.encode(list(texts), num_threads=num_threads)
        split = [t.split("\n") for t in texts]
        flat = self.sp.encode([ln for lines in split for ln in lines], num_threads=num_threads)
        out, i = [], 0
        for lines in split:
            ids = list(flat[i])
            for piece_ids in flat[i + 1 : i + len(lines)]:
                ids.append(self.newline_id)
                ids.extend(piece_ids)
            out.append(ids)
            i += len(lines)
        return out

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        del skip_special_tokens  # control pieces (bos, eos, pad) decode to nothing anyway
        ids = [int(i) for i in ids]
        if self.newline_id < 0:
            return self.sp.decode(ids)
        lines, current = [], []
        for i in ids:
            if i == self.newline_id:
                lines.append(current)
                current = []
            else:
                current.append(i)
        lines.append(current)
        return "\n".join(self.sp.decode(lines))

    def token_text(self, token_id: int) -> str:
        return self.sp.id_to_piece(int(token_id))


def training_lines(texts: Iterable[str]) -> Iterable[str]:
    """Non-empty lines of ``texts``; a line over SentencePiece's limit is cut at spaces."""
    for text in texts:
        for line in text.split("\n"):
            if not line.strip():
                continue
            if len(line.encode("utf-8")) <= MAX_TRAIN_LINE_BYTES:
                yield line
                continue
            for chunk in _LINE_CHUNK.findall(line):
                if chunk.strip():
                    yield chunk


def train(
    texts: Iterable[str], vocab_size: int, out_path: str | Path, *, num_threads: int = 2
) -> Path:
    """Train a BPE model on ``texts`` and write it atomically to ``out_path``."""
    check_trainable(vocab_size)
    lines = training_lines(texts)
    first = next(iter(lines), None)
    if first is None:
        raise ConfigError("config.data.paths: no text to train the tokenizer on")
    model = io.BytesIO()
    try:
        # minloglevel, not logstream: the latter needs a real sys.stderr (not in notebooks).
        spm.SentencePieceTrainer.train(
            sentence_iterator=_chain(first, lines),
            model_writer=model,
            model_type="bpe",
            vocab_size=vocab_size,
            byte_fallback=True,
            character_coverage=0.9995,
            split_digits=True,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_id=PAD_ID,
            input_sentence_size=0,
            max_sentence_length=MAX_TRAIN_LINE_BYTES,
            num_threads=num_threads,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ConfigError(_explain(str(e), vocab_size)) from None
    with cache.atomic_file(out_path) as f:
        f.write(model.getvalue())
    return Path(out_path)


def _chain(first: str, rest: Iterable[str]) -> Iterable[str]:
    yield first
    yield from rest


def _explain(message: str, vocab_size: int) -> str:
    """SentencePiece's failure as one line naming the field to change."""
    high = re.search(
        r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", message
    )
    if high:
        return (
            f"config.model.vocab_size: the training text supports at most {high.group(2)} "
            f"pieces, not {vocab_size}; lower model.vocab_size or add text"
        )
    low = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if low:
        return (
            f"config.model.vocab_size: {vocab_size} is below the {low.group(2)} pieces the "
            "training text's characters need; raise model.vocab_size"
        )
    return f"config.model.vocab_size: SentencePiece training failed: {message.splitlines()[0]}"
