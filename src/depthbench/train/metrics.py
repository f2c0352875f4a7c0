"""What a run logs: ``metrics.jsonl`` and TensorBoard events (tensorboardX).

``metrics.jsonl`` holds one JSON object per logged step (step, loss, lr,
grad_norm, tokens, tokens_per_sec, mfu and, at eval steps, val_loss); the
TensorBoard events hold the same scalars under ``train/`` and ``eval/`` plus
the per-block residual-stream statistics under ``layers/``.

A resumed run continues from its checkpoint step, so anything logged after
that step by the interrupted session is dropped: the jsonl is rewritten
without those lines (atomically), and TensorBoard is told to purge events
from that step on.  The files then read as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from depthbench import faults

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"


def _clean(value: Any) -> Any:
    """JSON-safe scalars: numpy -> python; NaN/inf -> None (JSON has neither)."""
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line torn by a kill: nothing after it was written either
    return rows


def truncate_jsonl(path: str | Path, after_step: int) -> None:
    """Keep only rows with ``step <= after_step`` (atomic rewrite)."""
    path = Path(path)
    if not path.exists():
        return
    rows = [r for r in read_jsonl(path) if r.get("step", 0) <= after_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


class MetricsWriter:
    """Appends to ``metrics.jsonl`` and writes TensorBoard scalars (process 0 only)."""

    def __init__(self, workdir: str | Path, start_step: int = 0, *, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(workdir) / METRICS_FILE
        self._tb = None
        self._failed = False  # a write failed (disk full): closing may fail the same way
        if not enabled:
            return
        truncate_jsonl(self.path, start_step)
        self._file = self.path.open("a")
        from tensorboardX import SummaryWriter

        tb_dir = Path(workdir) / TB_DIR
        purge = start_step + 1 if tb_dir.exists() else None
        self._tb = SummaryWriter(str(tb_dir), purge_step=purge, flush_secs=30)

    def log(self, step: int, scalars: dict[str, Any]) -> dict:
        """One jsonl row (``step`` first) and the same scalars in TensorBoard."""
        row = {"step": int(step), **{k: _clean(v) for k, v in scalars.items()}}
        if not self.enabled:
            return row
        try:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        except OSError as e:
            # A row torn by a full disk is dropped on resume (read_jsonl stops there).
            self._failed = True
            raise faults.storage_error(e, f"metrics: could not write {self.path}",
                                       "earlier checkpoints are intact: free space and re-run "
                                       "the same command to resume") from e
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                group = "eval" if key.startswith("val_") else "train"
                self._tb.add_scalar(f"{group}/{key}", value, step)
        return row

    def layer_stats(self, step: int, stats: dict[str, np.ndarray]) -> None:
        """Per-depth curves: ``layers/<stat>/<index>`` (index = block or depth state)."""
        if not self.enabled:
            return
        for name, values in stats.items():
            for i, v in enumerate(np.asarray(values, dtype=np.float64).ravel()):
                self._tb.add_scalar(f"layers/{name}/{i:03d}", float(v), step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        if self.enabled:
            self._tb.add_text(tag, text, step)

    def flush(self) -> None:
        if self.enabled:
            self._file.flush()
            self._tb.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        try:
            self._file.close()
            self._tb.close()
        except OSError:
            if not self._failed:
                raise  # else: the write that failed has been reported already
