"""Which of a run directory's records are damaged: what a report checks
before it shows a run, so that it never shows a damaged one silently."""

from __future__ import annotations

import os

from depthbench.rundir import io
from depthbench.rundir.names import RECORDS


def damaged_records(run_dir: str | os.PathLike) -> list[io.DamagedFile]:
    """The records of ``run_dir`` (config.json, result.json, the JSON-lines logs,
    sweep_run.json) that exist but cannot be read, in that order."""
    run_dir = io.as_path(run_dir)
    found = []
    for name in RECORDS:
        read = io.read_jsonl if name.endswith(".jsonl") else io.read_json
        try:
            read(run_dir / name)
        except io.DamagedFile as e:
            found.append(e)
    return found


def describe(damage: list[io.DamagedFile]) -> str:
    """``"result.json is not JSON (...); metrics.jsonl line 3 ..."``: the files by name."""
    return "; ".join(f"{io.as_path(d.path).name} {d.reason}" for d in damage)
