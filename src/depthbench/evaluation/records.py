"""Where evaluation records come from: ``--data-dir DIR`` (``DIR/<task>.jsonl`` or
``.parquet``, fields as docs/EVAL.md lists them), or the hub through
``datasets``.  Anything missing is one ConfigError line naming the file or
dataset."""

from __future__ import annotations

import json
from pathlib import Path

from depthbench.errors import ConfigError


def local_file(data_dir: str | Path, name: str) -> Path:
    d = Path(data_dir).expanduser()
    for ext in ("jsonl", "parquet"):
        if (d / f"{name}.{ext}").is_file():
            return d / f"{name}.{ext}"
    raise ConfigError(f"--data-dir: {d / (name + '.jsonl')} (or .parquet) does not exist; "
                      f"put the {name} records there (docs/EVAL.md lists the fields)")


def read_file(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several types for a bad file
            raise ConfigError(f"--data-dir: {path} is not a readable parquet file ({e})") from None
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"--data-dir: {path}:{n} is not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ConfigError(f"--data-dir: {path}:{n} is not a JSON object")
            out.append(record)
    if not out:
        raise ConfigError(f"--data-dir: {path} holds no records")
    return out


def from_hub(path: str, name: str | None, split: str, task: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(f"{task}: the `datasets` package is not installed; pip install "
                          "'depthbench[eval]' or give --data-dir with local copies") from None
    try:
        return list(datasets.load_dataset(path, name, split=split))
    except Exception as e:  # offline, gated (gpqa), renamed...: one line, then the way out
        detail = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise ConfigError(f"{task}: could not load {path}"
                          f"{'/' + name if name else ''} [{split}] from the hub ({detail}); "
                          f"give --data-dir with {task}.jsonl or {task}.parquet") from None


def load(task: str, *, hf_path: str, hf_name: str | None, split: str,
         data_dir: str | Path | None, limit: int | None = None) -> tuple[list[dict], str]:
    """(records, where they came from)."""
    if data_dir:
        path = local_file(data_dir, task)
        docs, source = read_file(path), str(path)
    else:
        docs = from_hub(hf_path, hf_name, split, task)
        source = f"hf:{hf_path}{'/' + hf_name if hf_name else ''}[{split}]"
    return (docs[:limit] if limit else docs), source
