"""The inputs of ``data tokenize``: files cut into work units that stream their documents.

A unit is a Parquet row group, the JSON lines that *start* in a byte range, or
a whole gzipped or text file, read by :mod:`depthbench.data.readers` as ``data
prepare`` reads it.  Units are numbered in input order, so the output does not
depend on how many workers ran them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

from depthbench.data import readers
from depthbench.data.corpora import resolve_paths
from depthbench.errors import ConfigError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt", ".text", ".md")
ALLOWED = ".parquet, .jsonl/.json/.ndjson (optionally .gz), .txt/.text/.md (optionally .gz)"
CHUNK_BYTES = 64 << 20  # jsonl byte range per unit
BATCH_DOCUMENTS = 256  # documents handed to the tokenizer at once
PREFLIGHT_BYTES = 1 << 20  # of each file, read before anything is written
NAMES = readers.TOKENIZE


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
            meta = readers.parquet_file(path, text_field, NAMES).metadata
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


def preflight(units: list[Unit], text_field: str) -> None:
    """Read the first :data:`PREFLIGHT_BYTES` of each file (parquet: its schema,
    checked by :func:`plan_units`); raise the first problem found, or that the
    inputs hold no document when that reading covered all of them."""
    found, covered = False, True
    for unit in units:
        if unit.start != 0:
            continue
        if unit.kind == "parquet":
            covered = False  # its rows may all be empty: known only by reading them
            continue
        if unit.kind.startswith("text"):
            head = readers.read_text(unit.path, NAMES, limit=PREFLIGHT_BYTES)
            found = found or bool(head.strip())
        else:
            for _ in readers.jsonl_documents(unit.path, text_field, NAMES, stop=PREFLIGHT_BYTES):
                found = True
        whole = not unit.kind.endswith(".gz") and os.path.getsize(unit.path) <= PREFLIGHT_BYTES
        covered = covered and whole
    if covered and not found:
        raise no_documents(len({u.path for u in units}))


def no_documents(files: int) -> ConfigError:
    return ConfigError(f"--input: the {files} file(s) hold no documents (every text empty, "
                       "null or blank); nothing written")


def documents(unit: Unit, text_field: str) -> Iterator[tuple[list[str], int]]:
    """Batches of the unit's non-empty documents, each with the input bytes it consumed."""
    if unit.kind == "parquet":
        pf = readers.parquet_file(unit.path, text_field, NAMES)
        rows = pf.metadata.row_group(unit.start).num_rows
        for texts, n in readers.parquet_documents(pf, unit.start, text_field, BATCH_DOCUMENTS):
            yield texts, (unit.weight * n) // max(1, rows)
    elif unit.kind.startswith("jsonl"):
        yield from _jsonl_batches(unit, text_field)
    else:
        yield list(readers.text_documents(unit.path, "file", NAMES)), unit.weight


def _jsonl_batches(unit: Unit, text_field: str) -> Iterator[tuple[list[str], int]]:
    gz = unit.kind == "jsonl.gz"
    span = max(1, unit.stop - unit.start)
    batch, reported = [], unit.start if not gz else 0
    records = readers.jsonl_documents(unit.path, text_field, NAMES, start=unit.start,
                                      stop=None if gz else unit.stop)
    end = reported
    for text, end in records:
        batch.append(text)
        if len(batch) == BATCH_DOCUMENTS:
            yield batch, ((end - reported) * unit.weight) // span
            batch, reported = [], end
    last = end if gz else max(end, unit.stop)
    yield batch, ((last - reported) * unit.weight) // span


def fingerprint(path: str) -> list:
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]
