"""Prompts for ``depthbench generate``: one from the command line, or a
JSON-lines file of records each holding one in a field, checked before any
model is loaded (lines read as the instruction records' are:
:func:`depthbench.finetune.records.json_lines`).  Each problem is one
ConfigError line naming the option, the file and the line (an empty prompt,
text that is not valid Unicode, a line that is not a JSON object, a record
without the field or whose field is not text)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from depthbench.errors import ConfigError
from depthbench.finetune.records import json_lines, unicode_text


class Prompt(NamedTuple):
    record: dict  # what the output line repeats (the file's record, or {"prompt": TEXT})
    text: str
    where: str  # how an error names it: "--prompt", "--prompts: 'FILE' line N"


def from_text(text: str) -> list[Prompt]:
    """``--prompt TEXT``: one prompt."""
    if not text:
        raise ConfigError("--prompt: empty; give the text to continue")
    return [Prompt({"prompt": text}, unicode_text(text, "--prompt"), "--prompt")]


def from_jsonl(path: str, field: str) -> list[Prompt]:
    """``--prompts FILE.jsonl --field NAME``: ``record[NAME]`` of each line (blank
    lines skipped), in the file's order."""
    file = Path(path).expanduser()
    if not file.is_file():
        what = "is a directory" if file.is_dir() else "does not exist"
        raise ConfigError(f"--prompts: {path!r} {what}; give a JSON-lines file")
    try:
        content = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"--prompts: {path!r} is not UTF-8 text (JSON lines)") from None
    out = []
    for number, record in json_lines(content, lambda n: f"--prompts: {path!r} line {n}"):
        where = f"--prompts: {path!r} line {number}"
        if not isinstance(record, dict):
            raise ConfigError(f"{where} holds a JSON {type(record).__name__}, not an object "
                              f"with a {field!r} field")
        if field not in record:
            raise ConfigError(f"{where} has no field {field!r} (--field names the prompt's "
                              f"field; the record has {', '.join(map(repr, record)) or 'none'})")
        text = record[field]
        if not isinstance(text, str):
            raise ConfigError(f"{where}: field {field!r} is a {type(text).__name__}, not text")
        if not text:
            raise ConfigError(f"{where}: the prompt ({field!r}) is empty")
        out.append(Prompt(record, unicode_text(text, f"{where}: the prompt ({field!r})"), where))
    if not out:
        raise ConfigError(f"--prompts: {path!r} holds no prompts")
    return out
