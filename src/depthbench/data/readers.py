"""Input formats: one reader per format (text, JSON lines, Parquet), shared by
``data prepare`` and ``data tokenize`` so a file gives both the same documents
(docs/DATA.md, "Corpora").  Every problem with a file is one
:class:`~depthbench.errors.ConfigError` naming the file, the line and the
setting to change, as :class:`Names` spells it for the command at hand."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

from depthbench.errors import ConfigError

SPLIT_BY = ("file", "paragraph")
_PARAGRAPH = re.compile(r"\n[ \t]*\n")


@dataclasses.dataclass(frozen=True)
class Names:
    """How messages name the input files and the text field."""

    paths: str
    text_field: str


PREPARE = Names("config.data.paths", "config.data.text_field")
TOKENIZE = Names("--input", "--text-field")


def is_gzip(path: str | Path) -> bool:
    return str(path).lower().endswith(".gz")


@contextlib.contextmanager
def _damage_is_bad_input(path, names: Names) -> Iterator[None]:
    """A damaged gzip stream (not gzip, truncated, corrupt) as one ConfigError."""
    try:
        yield
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ConfigError(f"{names.paths}: {path} is not a readable gzip file "
                          f"({type(e).__name__}: {e})") from None


def _utf8(data: bytes, path, names: Names, where: str = "", base: int = 0) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{names.paths}: {where or path} is not UTF-8 text (byte "
                          f"{e.object[e.start]:#04x} at offset {base + e.start})") from None


def read_text(path: str | Path, names: Names = PREPARE, *, limit: int = -1) -> str:
    """A text file's contents (its first ``limit`` bytes when >= 0, a character cut
    at the end dropped)."""
    opener = gzip.open if is_gzip(path) else open
    with _damage_is_bad_input(path, names), opener(path, "rb") as f:
        data = f.read(limit)
    if 0 <= limit <= len(data):
        data = data[: len(data) - _partial_tail(data)]
    return _utf8(data, path, names)


def _partial_tail(data: bytes) -> int:
    """Bytes of an incomplete UTF-8 character at the end of ``data`` (0-3)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): complete if it needs <= back bytes
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else 4
            return back if need > back else 0
    return 0


def text_documents(path: str | Path, split_by: str = "file",
                   names: Names = PREPARE) -> Iterator[str]:
    """The documents of a text file, a whole file or a paragraph each."""
    text = read_text(path, names).replace("\r\n", "\n").replace("\r", "\n")
    pieces = _PARAGRAPH.split(text) if split_by == "paragraph" else [text]
    for doc in pieces:
        doc = doc.strip("\n")
        if doc.strip():
            yield doc


def jsonl_documents(path: str | Path, text_field: str, names: Names = PREPARE, *,
                    start: int = 0, stop: int | None = None) -> Iterator[tuple[str, int]]:
    """``(document, end)`` for each line of a JSON-lines file with a non-empty
    ``text_field``; ``end`` is the byte offset after the line (of the
    decompressed stream for ``.gz``).

    ``start`` (plain files only) and ``stop`` read the lines that *start* in bytes
    ``[start, stop)``: a line crossing ``stop`` belongs to the range it starts in.
    """
    gz = is_gzip(path)
    with _damage_is_bad_input(path, names), (gzip.open if gz else open)(path, "rb") as f:
        lineno = 0 if start == 0 else None  # known only when reading from the top
        if start > 0:
            f.seek(start - 1)
            f.readline()  # the line in progress at `start` belongs to the previous range
        pos = f.tell()
        while stop is None or pos < stop:
            line = f.readline()
            if not line:
                break
            offset, pos = pos, pos + len(line)
            if lineno is not None:
                lineno += 1
            if not line.strip():
                continue
            where = f"{path}:{lineno}" if lineno is not None else f"{path} (line at byte {offset})"
            text = _json_text(line, where, offset, text_field, names)
            if text:
                yield text, pos


def _json_text(line: bytes, where: str, offset: int, field: str, names: Names) -> str | None:
    try:
        record = json.loads(_utf8(line, None, names, where, base=offset).rstrip("\r\n"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{names.paths}: {where} is not JSON "
                          f"({e.msg.removesuffix(' at')} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{names.text_field}: {where} is a JSON {type(record).__name__}, "
                          f"not an object with a {field!r} field")
    if field not in record:
        keys = ", ".join(list(record)[:8]) or "no fields"
        raise ConfigError(f"{names.text_field}: {where} has no field {field!r} (it has: {keys})")
    text = record[field]
    if text is not None and not isinstance(text, str):
        raise ConfigError(f"{names.text_field}: {where} field {field!r} is "
                          f"{type(text).__name__}, not a string")
    return text


def parquet_file(path: str | Path, text_field: str, names: Names = TOKENIZE):
    """The opened ``pyarrow.parquet.ParquetFile``, its ``text_field`` a string column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError subclasses
        raise ConfigError(f"{names.paths}: {path} is not a Parquet file ({e})") from None
    schema = pf.schema_arrow
    if text_field not in schema.names:
        raise ConfigError(f"{names.text_field}: {path} has no column {text_field!r} "
                          f"(columns: {', '.join(schema.names[:12])})")
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigError(f"{names.text_field}: {path} column {text_field!r} is {kind}, "
                          "not a string")
    return pf


def parquet_documents(pf, row_group: int, text_field: str,
                      batch_rows: int) -> Iterator[tuple[list[str], int]]:
    """Batches of one row group's non-empty documents, each with its row count."""
    for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[row_group],
                                 columns=[text_field]):
        yield [t for t in batch.column(0).to_pylist() if t], batch.num_rows
