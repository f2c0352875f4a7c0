"""Instruction records from local files: JSON, JSON lines or Parquet.

Commonsense170K and Alpaca name a record's fields alike: ``instruction``,
``input`` (optional context, often empty) and ``output`` (the response;
Commonsense170K's extra ``answer`` is the label inside it and is not read,
as the original's ``prepare_commonsense170k.py`` reads only the three).  A
``.json`` file holds a list of records (Alpaca's ``alpaca_data.json``,
Commonsense170K's ``commonsense_170k.json``) or one record per line;
``.jsonl``/``.ndjson`` one per line; ``.parquet`` one per row.  A record
without ``instruction`` or ``output``, a field that is not text, a file that
is not one of these, or no records at all is one line naming the file and
the record.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from depthbench.errors import ConfigError

SUFFIXES = (".json", ".jsonl", ".ndjson", ".parquet")


@dataclasses.dataclass(frozen=True)
class Record:
    instruction: str
    input: str
    output: str


def _record(raw, where: str, field: str) -> Record:
    if not isinstance(raw, dict):
        raise ConfigError(f"{field}: {where} is a JSON {type(raw).__name__}, not a record with "
                          "instruction/input/output fields")
    for name in ("instruction", "output"):
        if name not in raw:
            has = ", ".join(list(raw)[:8]) or "no fields"
            raise ConfigError(f"{field}: {where} has no {name!r} field (it has: {has}); "
                              "instruction records name instruction, input (optional), output")
    values = {}
    for name in ("instruction", "input", "output"):
        value = raw.get(name)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{field}: {where} field {name!r} is {type(value).__name__}, "
                              "not text")
        values[name] = value or ""
    return Record(**values)


def _json_lines(text: str, path: Path, field: str) -> list:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{field}: {path}:{n} is not JSON ({e.msg})") from None
    return rows


def _parquet_rows(path: Path, field: str) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{field}: reading {path} needs pyarrow: pip install "
                          "'depthbench[eval]'") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow's ArrowInvalid / OSError
        raise ConfigError(f"{field}: {path} is not a Parquet file "
                          f"({' '.join(str(e).split())[:120]})") from None


def read_records(path: str | Path, field: str = "RECORDS") -> list[Record]:
    """Every record of ``path`` (``field``: what error lines name it by)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{field}: {str(path)!r} is not a file")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"{field}: {path} is not one of {', '.join(SUFFIXES)}")
    if suffix == ".parquet":
        rows = _parquet_rows(path, field)
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{field}: {path} cannot be read as UTF-8 text ({e})") from None
        rows = None
        if suffix == ".json":
            try:
                whole = json.loads(text)
                rows = whole if isinstance(whole, list) else [whole]
            except json.JSONDecodeError:
                rows = None  # one record per line, like .jsonl
        if rows is None:
            rows = _json_lines(text, path, field)
    if not rows:
        raise ConfigError(f"{field}: {path} holds no records")
    return [_record(raw, f"{path} record {i}", field) for i, raw in enumerate(rows)]
