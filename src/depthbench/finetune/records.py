"""Instruction records: read from local files, rendered with the original's
template and label mask, tokenised with a run's tokenizer and cached
(``depthbench data sft``; docs/DATA.md, "Instruction records for fine-tuning").

The cache entry is renamed into place only once every record is encoded, so a
refused record writes nothing; each problem is one line naming the file, the
record and the line."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from depthbench import faults
from depthbench.data import cache
from depthbench.digest import file_sha256
from depthbench.errors import ConfigError

SUFFIXES = (".json", ".jsonl", ".ndjson", ".parquet")
WHAT = "data sft"
FORMAT = 1  # the entry's layout and the template's version
SPLITS = ("train", "val")
_CHUNK = 512  # records tokenised per call
WITH_INPUT = ("Below is an instruction that describes a task, paired with an input that provides "
              "further context. Write a response that appropriately completes the request.\n\n"
              "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
WITHOUT_INPUT = ("Below is an instruction that describes a task. Write a response that "
                 "appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Response:\n")


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
        values[name] = unicode_text(value or "", f"{field}: {where} field {name!r}")
    return Record(**values)


def unicode_text(text: str, where: str) -> str:
    """``text``, or one line naming ``where`` when it is not valid Unicode: a lone
    surrogate (JSON's ``"\\ud800"``; bytes that are not UTF-8 on a command line)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"{where} is not valid Unicode (a lone surrogate "
                          f"U+{ord(text[e.start]):04X} at character {e.start})") from None
    return text


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def json_lines(text: str, where: Callable[[int], str]) -> list[tuple[int, Any]]:
    """``(line number, value)`` of each line of JSON Lines ``text`` that is not blank
    (``where(n)``: how an error names line ``n``).  Lines end at ``\\n`` only: a
    U+2028 inside a string is text (``json.dumps(..., ensure_ascii=False)``
    writes it); NaN and Infinity, which JSON lacks, are refused."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                out.append((n, json.loads(line, parse_constant=_no_constant)))
            except ValueError as e:  # JSONDecodeError, or a constant
                raise ConfigError(f"{where(n)} is not JSON ({getattr(e, 'msg', e)}); expected "
                                  "one JSON object per line") from None
    return out


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
        rows = [(f"{path} record {i}", raw) for i, raw in enumerate(_parquet_rows(path, field))]
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{field}: {path} cannot be read as UTF-8 text ({e})") from None
        rows = None
        if suffix == ".json":
            try:
                whole = json.loads(text, parse_constant=_no_constant)
                rows = [(f"{path} record {i}", raw) for i, raw in
                        enumerate(whole if isinstance(whole, list) else [whole])]
            except json.JSONDecodeError:
                rows = None  # one record per line, like .jsonl
            except ValueError as e:  # NaN or Infinity
                raise ConfigError(f"{field}: {path} is not JSON ({e})") from None
        if rows is None:
            rows = [(f"{path} record {i} (line {n})", raw) for i, (n, raw) in enumerate(
                json_lines(text, lambda n: f"{field}: {path} line {n}"))]
    if not rows:
        raise ConfigError(f"{field}: {path} holds no records")
    return [_record(raw, where, field) for where, raw in rows]


def prompt(record: Record) -> str:
    """The Alpaca prompt (instruction and input stripped; the input form when it is set)."""
    instruction, context = record.instruction.strip(), record.input.strip()
    if context:
        return WITH_INPUT.format(instruction=instruction, input=context)
    return WITHOUT_INPUT.format(instruction=instruction)


def response(record: Record) -> str:
    return record.output.strip()


def encode(prompt_ids: list[int], response_ids: list[int], eos_id: int, max_seq_len: int,
           where: str, field: str = "--max-seq-len") -> tuple[np.ndarray, np.ndarray, bool]:
    """``(ids, label mask, truncated)`` of one record (``where`` names it in errors,
    ``field`` the setting of ``max_seq_len``)."""
    ids = [*prompt_ids, *response_ids, eos_id]
    mask = [False] * len(prompt_ids) + [True] * (len(response_ids) + 1)
    truncated = len(ids) > max_seq_len
    if truncated:
        ids = ids[:max_seq_len - 1] + [eos_id]
        mask = mask[:max_seq_len - 1] + [True]
        if not any(mask[:-1]):
            raise ConfigError(f"{field} {max_seq_len}: {where}'s prompt alone is "
                              f"{len(prompt_ids)} tokens, so the original's truncation leaves "
                              f"no response token; raise {field} or drop the record")
    return np.asarray(ids, np.int64), np.asarray(mask, bool), truncated


@dataclasses.dataclass(frozen=True)
class SFTData:
    """A prepared entry: its directory and manifest; arrays read on demand."""

    directory: Path
    manifest: dict

    @property
    def digest(self) -> str:
        return self.manifest["digest"]

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, mask, offsets)`` of split ``name``, memory-mapped."""
        return tuple(np.load(self.directory / f"{name}_{part}.npy", mmap_mode="r")
                     for part in ("ids", "mask", "offsets"))

    def records(self, name: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each record of split ``name`` as ``(ids, label mask)``."""
        ids, mask, offsets = self.split(name)
        return [(np.asarray(ids[a:b]), np.asarray(mask[a:b]))
                for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def _entry(path: Path) -> SFTData | str:
    """The entry at ``path``, checked, or why it is not a whole one (headers and
    lengths against its manifest, as the token cache checks its arrays)."""
    try:
        manifest = cache.read_json(path / "manifest.json")
    except (OSError, ValueError):
        return "no readable manifest.json"
    if not isinstance(manifest, dict) or (manifest.get("kind"), manifest.get("format")) != (
            "sft", FORMAT):
        return f"its manifest.json is not a data sft entry of format {FORMAT}"
    data = SFTData(path.resolve(), manifest)
    for name in SPLITS:
        counts = manifest.get("splits", {}).get(name, {})
        try:
            ids, mask, offsets = data.split(name)
        except (OSError, ValueError) as e:  # missing, truncated, not .npy
            return f"its {name} arrays are unreadable: {' '.join(str(e).split())[:100]}"
        if not (len(ids) == len(mask) == counts.get("tokens") and len(offsets) == counts.get(
                "records", -2) + 1 and offsets[0] == 0 and offsets[-1] == len(ids)):
            return f"its {name} arrays do not match manifest.json"
    return data


def open_sft(directory: str | Path, field: str = "--data") -> SFTData:
    """A prepared entry (``data sft`` printed its directory); one line if it is not
    a whole one."""
    entry = _entry(Path(directory).expanduser())
    if isinstance(entry, str):
        raise ConfigError(f"{field}: {str(directory)!r} is not a whole `depthbench data sft` "
                          f"entry ({entry}); run `depthbench data sft` again")
    return entry


# What the error lines call each option: data sft's (the finetune spec's: config.finetune.*).
OPTIONS = {"max_seq_len": "--max-seq-len", "max_samples": "--max-samples",
           "val_fraction": "--val-fraction", "seed": "--seed"}


def _check(options: dict, fields: dict[str, str]) -> None:
    max_seq_len, max_samples = options["max_seq_len"], options["max_samples"]
    if max_seq_len < 2:
        raise ConfigError(f"{fields['max_seq_len']}: {max_seq_len}; want at least 2 (one "
                          "response token and EOS)")
    if max_samples is not None and max_samples < 1:
        raise ConfigError(f"{fields['max_samples']}: {max_samples}; want a positive count")
    if not 0.0 < options["val_fraction"] < 1.0:
        raise ConfigError(f"{fields['val_fraction']}: {options['val_fraction']}; want a share "
                          "in (0, 1)")
    if options["seed"] < 0:  # numpy's generators take any integer from 0
        raise ConfigError(f"{fields['seed']}: {options['seed']}; want an integer >= 0")


def _split_sizes(n: int, val_fraction: float, where: Path, field: str) -> tuple[int, int]:
    n_val = max(1, round(n * val_fraction))
    if n - n_val < 1:
        raise ConfigError(f"{field}: {where} holds {n} record(s); holding out "
                          f"{n_val} for validation leaves none to train on")
    return n - n_val, n_val


def _encode(records, tok, max_seq_len: int, where: str, progress: bool, length_field: str):
    """``(ids, mask, offsets, truncated)`` of ``records`` (a list of (index, Record))."""
    from tqdm import tqdm

    ids, masks, lengths, truncated = [], [], [], 0
    with tqdm(total=len(records), desc=f"tokenising {where}", unit="record",
              disable=not progress) as bar:
        for start in range(0, len(records), _CHUNK):
            chunk = records[start:start + _CHUNK]
            prompts = tok.encode_batch([prompt(r) for _, r in chunk])
            answers = tok.encode_batch([response(r) for _, r in chunk])
            for (i, _), p, a in zip(chunk, prompts, answers, strict=True):
                x, m, cut = encode(p, a, tok.eos_id, max_seq_len, f"record {i}", length_field)
                ids.append(x)
                masks.append(m)
                lengths.append(len(x))
                truncated += cut
            bar.update(len(chunk))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    return np.concatenate(ids).astype(dtype), np.concatenate(masks), offsets, truncated


def prepare_sft(records_path: str | Path, run_dir: str | Path, *, max_seq_len: int = 512,
                max_samples: int | None = None, val_fraction: float = 0.02, seed: int = 42,
                cache_dir: str = "", progress: bool = True, field: str = "RECORDS",
                fields: dict[str, str] = OPTIONS) -> SFTData:
    """The cache entry of ``records_path`` tokenised by ``run_dir``'s tokenizer (built
    if absent or damaged; ``field``, ``fields``: what error lines call the records
    and the options)."""
    from depthbench.run import open_run

    options = {"max_seq_len": max_seq_len, "max_samples": max_samples,
               "val_fraction": val_fraction, "seed": seed}
    _check(options, fields)
    source = Path(records_path).expanduser()
    if not source.is_file():
        raise ConfigError(f"{field}: {str(records_path)!r} is not a file")
    run = open_run(run_dir, WHAT)
    tok = run.tokenizer
    if tok.eos_id < 0:
        raise ConfigError(f"{WHAT}: the tokenizer of {run.path} has no EOS id, which ends "
                          "every response")
    key = cache.digest("sft", FORMAT, file_sha256(source), tok.sha256, tok.eos_id,
                       tok.vocab_size, options)
    root = cache.cache_root(cache_dir)
    final = root / "sft" / key
    entry = _entry(final) if final.exists() else None
    if isinstance(entry, SFTData):
        return entry
    # Every record encoded before the cache is touched: a refused one writes nothing.
    records = read_records(source, field)
    order = np.random.default_rng(seed).permutation(len(records))[:max_samples]
    _, n_val = _split_sizes(len(order), val_fraction, source, field)
    split_of = {"val": order[:n_val], "train": order[n_val:]}
    manifest = {"kind": "sft", "format": FORMAT, "digest": key,
                "source": str(source.resolve()), "source_sha256": file_sha256(source),
                "records_in_file": len(records), "run": str(run.path), "tokenizer": tok.record(),
                "template": "alpaca (prepare_commonsense170k.py)", **options, "splits": {}}
    arrays = {}
    for name in SPLITS:
        chosen = [(int(i), records[i]) for i in split_of[name]]
        ids, mask, offsets, truncated = _encode(chosen, tok, max_seq_len, name, progress,
                                                fields["max_seq_len"])
        arrays |= {f"{name}_ids": ids, f"{name}_mask": mask, f"{name}_offsets": offsets}
        manifest["splits"][name] = {
            "records": len(chosen), "tokens": int(len(ids)), "supervised_tokens": int(mask.sum()),
            "truncated": int(truncated), "longest": int(np.max(np.diff(offsets)))}
    with cache.exclusive(root):
        entry = _entry(final) if final.exists() else None  # built meanwhile by another?
        if isinstance(entry, SFTData):
            return entry
        if entry is not None:
            print(f"depthbench: warning: the cache entry {final} is damaged ({entry}); "
                  "rebuilding it", file=sys.stderr, flush=True)
            shutil.rmtree(final)
        try:
            with cache.atomic_dir(final) as work:  # removed again if a write fails
                for name, array in arrays.items():
                    np.save(work / f"{name}.npy", array)
                cache.write_json(work / "manifest.json", manifest)
        except OSError as e:
            if not faults.is_storage_error(e):
                raise
            raise faults.storage_error(e, f"{WHAT}: could not write the cache entry {final}",
                                       faults.retry_hint(e)) from e
    return open_sft(final)
