"""Reading and writing a run directory's JSON and JSON-lines records.

Writers replace a JSON file whole (:func:`atomic_write_json`: a temporary
file renamed over the old one), so a reader sees the old or the new
content, never half.  A JSON-lines log (:class:`JsonlLog`) grows one line at
a time, each written and flushed in one call.

Readers do not guess.  A record that is present but cannot be read raises
:class:`DamagedFile` (a ConfigError naming the file and what is wrong with
it); each reader decides what a damaged record means for it (the trainer
refuses to resume over a garbage ``result.json``, a report marks the run).

**The torn-line rule** (every reader of a ``.jsonl`` file, through
:func:`read_jsonl`): the only damage a JSON-lines log may carry is a last
line cut short by a kill or a full disk while it was being appended -- a
last line with no newline at its end that does not parse.  That line is
dropped: the step it logged is logged again when the run resumes from its
checkpoint.  Any other line that is not a JSON object (in the middle of the
file, or a whole line ending in its newline) means the file was damaged
some other way, and :func:`read_jsonl` raises :class:`DamagedFile` naming
the line.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
from collections.abc import Iterable
from typing import Any

import numpy as np
from etils import epath

from depthbench import confine
from depthbench.errors import ConfigError

JSON_LIMIT = 1 << 26  # bytes of one JSON record or config read (a config is kilobytes)
# Bytes of a JSON-lines log read whole: a paper run's metrics.jsonl is megabytes; a
# received run's log is refused before it is read rather than exhaust memory.
LOG_LIMIT = 1 << 30
JSON_DEPTH = 64  # levels of nesting (a config has under ten)


class DamagedFile(ConfigError):
    """A run-directory record that exists but cannot be trusted.

    ``path``: the file; ``reason``: what is wrong (one line); ``rows``: for
    a JSON-lines log, the rows before the damaged line."""

    def __init__(self, path: Any, reason: str, rows: Iterable[dict] = ()):
        self.path, self.reason, self.rows = path, reason, list(rows)
        super().__init__(f"{path}: {reason}")


# ------------------------------------------------------------------ paths


def as_path(path: str | os.PathLike) -> epath.Path:
    """A local or remote (gs://...) path; run directories may live in a bucket."""
    return epath.Path(path)


def is_local(path: str | os.PathLike) -> bool:
    return "://" not in str(path)


# ----------------------------------------------------------------- values


def finite(x: Any) -> bool:
    """Whether a recorded value (a loss, a norm) is a number, not None / NaN / inf."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it: NaN and inf become None (JSON has neither),
    numpy scalars and arrays Python numbers and lists, tuples lists, keys
    strings; anything else its ``str()``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if hasattr(value, "item"):  # numpy and jax scalars
        return json_safe(value.item())
    return str(value)


# ------------------------------------------------------------------- JSON


def atomic_write(path: str | os.PathLike, text: str) -> None:
    """Write a file so that readers see the old or the new content, never half."""
    path = as_path(path)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:  # a full disk: leave no half-written twin behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        e.filename = str(path)  # the file being written, not its temporary twin
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=1, default=str) + "\n")


def _text(path: epath.Path, limit: int | None) -> str | None:
    """The file's text (at most ``limit`` bytes: None, unbounded); None when it
    does not exist."""
    try:
        if is_local(path):
            if not os.path.lexists(path):
                return None
            with confine.open_regular(path, "", limit) as f:
                data = f.read() if limit is None else f.read(limit + 1)
        else:
            if limit is not None and path.exists() and path.stat().length > limit:
                raise DamagedFile(path, f"holds {path.stat().length:,} bytes; at most "
                                  f"{limit:,} are read")
            data = path.read_bytes()
        if limit is not None and len(data) > limit:
            raise DamagedFile(path, f"holds more than {limit:,} bytes")
        return data.decode()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise DamagedFile(path, "is not UTF-8 text") from None
    except DamagedFile:
        raise
    except confine.Unreadable as e:  # a link, a FIFO, too big
        raise DamagedFile(path, e.reason) from None
    except OSError as e:
        raise DamagedFile(path, f"cannot be read ({e.strerror or e})") from None


def _depth(obj: Any) -> int:
    """How deeply ``obj``'s lists and objects nest (iteratively: no recursion)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if level <= JSON_DEPTH:
                stack.extend((v, level + 1) for v in (node.values() if isinstance(node, dict)
                                                      else node))
    return deepest


def loads(text: str | bytes, where: Any, *, position: bool = True) -> Any:
    """The JSON document ``text`` (of the file ``where``); :class:`DamagedFile`
    when it is not JSON (``position``: saying where) or nests deeper than
    :data:`JSON_DEPTH` levels."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        at = f": line {e.lineno} column {e.colno}" if position else ""
        raise DamagedFile(where, f"is not JSON ({e.msg}{at})") from None
    except RecursionError:
        obj = None
        deep = True
    except UnicodeDecodeError:
        raise DamagedFile(where, "is not UTF-8 text") from None
    else:
        deep = _depth(obj) > JSON_DEPTH
    if deep:
        raise DamagedFile(where, f"nests deeper than {JSON_DEPTH} levels")
    return obj


def read_json(path: str | os.PathLike, limit: int = JSON_LIMIT) -> dict | None:
    """The JSON object in ``path``; None when there is no such file.

    Raises :class:`DamagedFile` when the file exists but is not a JSON object
    within the bounds (module docstring; writers replace these files
    atomically, so that is damage, not a write in progress)."""
    path = as_path(path)
    text = _text(path, limit)
    if text is None:
        return None
    obj = loads(text, path)
    if not isinstance(obj, dict):
        raise DamagedFile(path, f"holds a JSON {type(obj).__name__}, not an object")
    return obj


# ------------------------------------------------------------ JSON lines


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The rows of a JSON-lines log under the torn-line rule (module docstring);
    [] when there is no such file."""
    path = as_path(path)
    text = _text(path, LOG_LIMIT)  # a log grows with its run: a generous cap
    if text is None:
        return []
    lines = text.split("\n")  # the last item is "" when the file ends in a newline
    rows: list[dict] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        torn = number == len(lines)  # the last line, and no newline after it
        try:
            row = loads(line, path, position=False)
        except DamagedFile as e:
            if torn:
                break
            raise DamagedFile(path, f"line {number} {e.reason}", rows) from None
        if not isinstance(row, dict):
            raise DamagedFile(path, f"line {number} holds a JSON {type(row).__name__}, not an "
                              "object", rows)
        rows.append(row)
    return rows


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Replace a JSON-lines log with ``rows`` (atomically)."""
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in rows))


def set_aside(path: str | os.PathLike) -> epath.Path:
    """Move a damaged file to ``<name>.damaged`` (``.damaged.1``, ... if taken),
    keeping it for inspection; return where it went."""
    from depthbench.rundir.names import DAMAGED_SUFFIX

    path = as_path(path)
    dest, n = path.with_name(path.name + DAMAGED_SUFFIX), 1
    while dest.exists():
        dest, n = path.with_name(f"{path.name}{DAMAGED_SUFFIX}.{n}"), n + 1
    path.rename(dest)
    return dest


class JsonlLog:
    """Appends rows (one JSON object per line, ``step`` first) to a log that a
    resumed run continues.

    Opened at ``start_step``, the log keeps only rows of steps up to it (an
    atomic rewrite), so a run resumed from its checkpoint reads as one
    uninterrupted run.  A log damaged beyond the torn-line rule is moved
    aside (:func:`set_aside`, named through ``warn``) and its rows before the
    damage are kept."""

    def __init__(self, path: str | os.PathLike, start_step: int = 0, *, warn=None):
        self.path = as_path(path)
        damaged = False
        try:
            rows = read_jsonl(self.path)
        except DamagedFile as e:
            moved, damaged, rows = set_aside(self.path), True, e.rows
            if warn is not None:
                warn(f"depthbench: warning: {e}; moved to {moved}, keeping the {len(rows)} row(s) "
                     "before it")
        kept = [r for r in rows if r.get("step", 0) <= start_step]
        if damaged or kept != rows:
            write_jsonl(self.path, kept)
        self._file = None  # opened at the first row: a log nothing is written to stays absent

    def append(self, row: dict) -> None:
        """One line, written and flushed in one call (an OSError propagates)."""
        if self._file is None:
            self._file = open(self.path, "a")  # noqa: SIM115 (open while the run logs)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
