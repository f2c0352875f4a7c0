"""What a run logs: ``metrics.jsonl``, ``layer_stats.jsonl`` and TensorBoard
events (tensorboardX), and W&B through :mod:`~depthbench.train.wandb_sink`.

A resumed run rewrites each log without the rows the interrupted session
wrote after its checkpoint step (:class:`~depthbench.rundir.io.JsonlLog`) and
tells TensorBoard to purge them, so the files read as one uninterrupted run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from depthbench import faults
from depthbench.rundir.io import JsonlLog, json_safe
from depthbench.rundir.names import LAYER_STATS_FILE, METRICS_FILE, TB_DIR

# What tensorboardX imports wherever it is installed and a run's scalars never use:
# torch (1.5 s of CPU), only to accept torch tensors; boto3 and google.cloud.storage
# (0.26 s together), only for s3:// and gs:// log directories (the writer below gets a
# local path; a TPU sweep's bucket is mounted with gcsfuse: launch/tpu_sweep.sh).
_UNUSED_BY_TENSORBOARDX = ("torch", "boto3", "google.cloud.storage")


def _summary_writer():
    """tensorboardX's ``SummaryWriter``, imported without the modules above (each
    left out only while tensorboardX imports, and only if not imported already)."""
    import sys

    if "tensorboardX" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    hidden = [name for name in _UNUSED_BY_TENSORBOARDX if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # `import name` raises ImportError while this is here
    try:
        from tensorboardX import SummaryWriter
    finally:
        for name in hidden:
            del sys.modules[name]
    return SummaryWriter


class MetricsWriter:
    """Appends to the run's JSON-lines logs and writes TensorBoard scalars, and
    W&B's when ``wandb`` is a mode of :mod:`~depthbench.train.wandb_sink`
    (process 0 only; ``warn``: where a damaged log set aside is named)."""

    def __init__(self, workdir: str | Path, start_step: int = 0, *, enabled: bool = True,
                 warn=None, wandb: str = ""):
        self.enabled = enabled
        self.path = Path(workdir) / METRICS_FILE
        self._tb = self._wandb = None
        self._failed = False  # a write failed (disk full): closing may fail the same way
        if not enabled:
            return
        self._metrics = JsonlLog(self.path, start_step, warn=warn)
        self._stats = JsonlLog(Path(workdir) / LAYER_STATS_FILE, start_step, warn=warn)
        SummaryWriter = _summary_writer()
        tb_dir = Path(workdir) / TB_DIR
        purge = start_step + 1 if tb_dir.exists() else None
        self._tb = SummaryWriter(str(tb_dir), purge_step=purge, flush_secs=30)
        if wandb:
            from depthbench.train.wandb_sink import WandbSink

            try:
                self._wandb = WandbSink(wandb, Path(workdir))
            except BaseException:
                self.close()  # W&B could not start: the run stops before its first step
                raise

    def _append(self, log: JsonlLog, row: dict) -> None:
        try:
            log.append(row)
        except OSError as e:
            # A row torn by a full disk is dropped on resume (the torn-line rule).
            self._failed = True
            # The trainer replaces the hint with what a re-run resumes from.
            raise faults.storage_error(e, f"metrics: could not write {log.path}",
                                       faults.retry_hint(e)) from e

    def log(self, step: int, scalars: dict[str, Any]) -> dict:
        """One jsonl row (``step`` first) and the same scalars in TensorBoard."""
        row = {"step": int(step), **json_safe(scalars)}
        if not self.enabled:
            return row
        self._append(self._metrics, row)
        self._scalars(step, {
            f"{'eval' if key.startswith('val_') else 'train'}/{key}": value
            for key, value in row.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)})
        return row

    def _scalars(self, step: int, scalars: dict[str, float]) -> None:
        """The same tagged scalars to TensorBoard and to W&B."""
        for tag, value in scalars.items():
            self._tb.add_scalar(tag, value, step)
        if self._wandb is not None:
            self._wandb.log(step, scalars)

    def layer_stats(self, step: int, stats: dict[str, np.ndarray]) -> None:
        """Per-depth curves: one layer_stats.jsonl row ``{"step", stat: [value per
        index]}`` and TensorBoard's ``layers/<stat>/<index>`` (index = block or
        depth state)."""
        if not self.enabled:
            return
        values = {name: np.asarray(v, dtype=np.float64).ravel() for name, v in stats.items()}
        self._append(self._stats, {"step": int(step), **json_safe(values)})
        self._scalars(step, {f"layers/{name}/{i:03d}": float(v)
                             for name, vector in values.items() for i, v in enumerate(vector)})

    def flush(self) -> None:
        if self.enabled:
            self._metrics.flush()
            self._tb.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        try:
            self._metrics.close()
            self._stats.close()
            self._tb.close()
        except OSError:
            if not self._failed:
                raise  # else: the write that failed has been reported already
        finally:
            if self._wandb is not None:
                self._wandb.close()
