"""The inputs of ``data tokenize``: files cut into work units that stream their documents.

A *unit* is the piece of one input file a worker tokenises on its own:

=============================  =================================================
``.parquet``                   one row group (the column ``--text-field``)
``.jsonl`` ``.json`` ``.ndjson``  the lines that *start* in a byte range of
                               ``chunk_bytes`` (a line crossing the range's end
                               belongs to the unit it starts in)
``.jsonl.gz`` ``.txt.gz``      the whole file (gzip cannot seek)
``.txt`` ``.text`` ``.md``     the whole file: one document
=============================  =================================================

Units are numbered in input order (files sorted within each glob, then row
group or byte offset), and the output is their tokens in that order, so it
does not depend on how many workers ran them.  Documents are read in batches
and never more than a batch is held in memory.  Empty documents (``""`` or
null) are skipped: they would only add an EOS.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path

from depthbench.config import ConfigError
from depthbench.data.corpora import resolve_paths

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt", ".text", ".md")
ALLOWED = ".parquet, .jsonl/.json/.ndjson (optionally .gz), .txt/.text/.md (optionally .gz)"
CHUNK_BYTES = 64 << 20  # jsonl byte range per unit
BATCH_DOCUMENTS = 256  # documents handed to the tokenizer at once


@dataclasses.dataclass(frozen=True)
class Unit:
    """A piece of one input file: rows ``[start, stop)`` of a parquet row group's
    file, or the lines starting in bytes ``[start, stop)`` of a jsonl file."""

    path: str
    kind: str  # parquet | jsonl | jsonl.gz | text | text.gz
    start: int
    stop: int
    weight: int  # input bytes, for the progress bar

    def label(self) -> str:
        return f"{self.path}[{self.start}:{self.stop}]"


def file_kind(path: Path) -> str:
    name = path.name.lower()
    gz = name.endswith(".gz")
    stem = name[:-3] if gz else name
    if stem.endswith(".parquet") and not gz:
        return "parquet"
    if stem.endswith(JSONL_SUFFIXES):
        return "jsonl.gz" if gz else "jsonl"
    if stem.endswith(TEXT_SUFFIXES):
        return "text.gz" if gz else "text"
    raise ConfigError(f"--input: {path} is not a file kind data tokenize reads ({ALLOWED})")


def input_files(pattern: str) -> list[Path]:
    """The files ``--input`` names (comma-separated files or globs), checked for their kind."""
    try:
        files = resolve_paths(pattern, field="data.paths")
    except ConfigError as e:
        raise ConfigError(str(e).replace("config.data.paths", "--input")) from None
    for f in files:
        file_kind(f)
    return files


def plan_units(files: list[Path], text_field: str, chunk_bytes: int = CHUNK_BYTES) -> list[Unit]:
    """Every unit of every file, in output order; parquet columns are checked here."""
    units: list[Unit] = []
    for path in files:
        kind, size = file_kind(path), path.stat().st_size
        if kind == "parquet":
            meta = _parquet_file(path, text_field).metadata
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                units.append(Unit(str(path), kind, g, g + 1, max(1, rg.total_byte_size)))
        elif kind == "jsonl":
            for start in range(0, max(size, 1), chunk_bytes):
                stop = min(size, start + chunk_bytes)
                units.append(Unit(str(path), kind, start, stop, max(1, stop - start)))
        else:
            units.append(Unit(str(path), kind, 0, size, max(1, size)))
    return units


def _parquet_file(path: Path, text_field: str):
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError subclasses
        raise ConfigError(f"--input: {path} is not a Parquet file ({e})") from None
    names = pf.schema_arrow.names
    if text_field not in names:
        raise ConfigError(f"--text-field: {path} has no column {text_field!r} "
                          f"(columns: {', '.join(names[:12])})")
    return pf


def documents(unit: Unit, text_field: str) -> Iterator[tuple[list[str], int]]:
    """Batches of the unit's non-empty documents, each with the input bytes it consumed."""
    if unit.kind == "parquet":
        yield from _parquet_batches(unit, text_field)
    elif unit.kind in ("jsonl", "jsonl.gz"):
        yield from _jsonl_batches(unit, text_field)
    else:
        opener = gzip.open if unit.kind == "text.gz" else open
        with opener(unit.path, "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"--input: {unit.path} is not UTF-8 text (byte offset "
                              f"{e.start})") from None
        yield ([text] if text else []), unit.weight


def _parquet_batches(unit: Unit, text_field: str):
    import pyarrow as pa

    pf = _parquet_file(Path(unit.path), text_field)
    rows = pf.metadata.row_group(unit.start).num_rows
    for batch in pf.iter_batches(batch_size=BATCH_DOCUMENTS, row_groups=[unit.start],
                                 columns=[text_field]):
        column = batch.column(0)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise ConfigError(f"--text-field: {unit.path} column {text_field!r} is "
                              f"{column.type}, not a string")
        texts = [t for t in column.to_pylist() if t]
        yield texts, (unit.weight * batch.num_rows) // max(1, rows)


def _jsonl_batches(unit: Unit, text_field: str):
    gz = unit.kind == "jsonl.gz"
    with (gzip.open(unit.path, "rb") if gz else open(unit.path, "rb")) as f:
        if not gz and unit.start > 0:
            f.seek(unit.start - 1)
            f.readline()  # the line in progress at `start` belongs to the previous unit
        pos = f.tell() if not gz else 0
        batch, consumed = [], 0
        while gz or pos < unit.stop:
            line = f.readline()
            if not line:
                break
            offset = pos
            pos += len(line)
            consumed += len(line)
            if line.strip():
                text = _json_text(unit.path, offset, line, text_field)
                if text:
                    batch.append(text)
            if len(batch) == BATCH_DOCUMENTS:
                yield batch, (consumed * unit.weight) // max(1, unit.stop - unit.start)
                batch, consumed = [], 0
        yield batch, (consumed * unit.weight) // max(1, unit.stop - unit.start)


def _json_text(path: str, offset: int, line: bytes, field: str) -> str | None:
    where = f"{path} (line at byte {offset})"
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--input: {where} is not a JSON object ({e})") from None
    if not isinstance(record, dict) or field not in record:
        keys = ", ".join(list(record)[:8]) if isinstance(record, dict) else type(record).__name__
        raise ConfigError(f"--text-field: {where} has no field {field!r} (it has: {keys})")
    text = record[field]
    if text is not None and not isinstance(text, str):
        raise ConfigError(f"--text-field: {where} field {field!r} is {type(text).__name__}, "
                          "not a string")
    return text


def fingerprint(path: str) -> list:
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]
