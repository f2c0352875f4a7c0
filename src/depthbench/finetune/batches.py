"""Fine-tuning batches: the rows of :mod:`.rows` as arrays, through grain.

A row of ``seq_len`` positions holds its records one after another: record
``ids`` (with label mask ``m``) gives inputs ``ids[:-1]``, targets
``ids[1:]`` and a loss mask ``m[1:]`` (the targets that are response or
EOS).  The rest of the row is padding: input and target ``pad_id``, mask
off.  A ``packed`` row also carries ``segments`` (1, 2, ... per record, 0 on
padding: attention stays inside a segment) and ``positions`` (each record
from 0, as if it stood alone).

Training batches are a grain ``MapDataset`` over the plan's row indices
(host ``p`` of ``P`` takes rows ``p, p + P, ...``, as pretraining's
pipeline does), so the iterator's state is one integer per host and a
resumed run continues with the batch it would have seen.  Validation is
every held-out record once, in order, the last batch filled with empty
rows; its loss is the mean over all supervised tokens
(:func:`val_loss`), not a mean of batch means.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grain
import jax
import numpy as np

from depthbench.errors import ConfigError
from depthbench.finetune.rows import RowPlan, check_fits, lay_out


class RowReader:
    """Row indices -> a host batch of one split's records (``plan`` lays them out)."""

    def __init__(self, directory: str, split: str, plan: RowPlan, seq_len: int, pad_id: int,
                 packed: bool):
        self.directory, self.split, self.plan = directory, split, plan
        self.seq_len, self.pad_id, self.packed = seq_len, pad_id, packed
        self._arrays = None
        self._open_lock = threading.Lock()  # the prefetch threads call at once

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_arrays"), state.pop("_open_lock")
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._arrays, self._open_lock = None, threading.Lock()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._arrays is None:
            with self._open_lock:
                if self._arrays is None:
                    self._arrays = tuple(
                        np.load(Path(self.directory) / f"{self.split}_{part}.npy", mmap_mode="r")
                        for part in ("ids", "mask", "offsets"))
        return self._arrays

    def __call__(self, row_ids) -> dict[str, np.ndarray]:
        ids, mask, offsets = self.arrays()
        b, t = len(row_ids), self.seq_len
        out = {"inputs": np.full((b, t), self.pad_id, np.int32),
               "targets": np.full((b, t), self.pad_id, np.int32),
               "mask": np.zeros((b, t), bool)}
        if self.packed:
            out["segments"] = np.zeros((b, t), np.int32)
            out["positions"] = np.zeros((b, t), np.int32)
        for i, r in enumerate(np.asarray(row_ids).tolist()):
            at = 0
            for k, record in enumerate(self.plan.row(r).tolist()):
                a, z = int(offsets[record]), int(offsets[record + 1])
                n = z - a - 1
                out["inputs"][i, at:at + n] = ids[a:z - 1]
                out["targets"][i, at:at + n] = ids[a + 1:z]
                out["mask"][i, at:at + n] = mask[a + 1:z]
                if self.packed:
                    out["segments"][i, at:at + n] = k + 1
                    out["positions"][i, at:at + n] = np.arange(n)
                at += n
        return out


def _hosts(batch_size: int) -> tuple[int, int, int]:
    p, n = jax.process_index(), jax.process_count()
    if batch_size % n:
        raise ConfigError(f"config.train.batch_size: {batch_size} is not divisible by the {n} "
                          "processes (each host loads batch_size / process_count rows)")
    return p, n, batch_size // n


def train_iterator(reader: RowReader, batch_size: int, steps: int, prefetch: int = 2):
    """Host-local batches for ``steps`` steps, checkpointable (grain)."""
    p, n, host_batch = _hosts(batch_size)
    ds = (grain.MapDataset.range(steps * batch_size)
          .slice(slice(p, None, n))
          .batch(host_batch, drop_remainder=True)
          .map(reader))
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=min(prefetch, 2),
                                                     prefetch_buffer_size=prefetch)))


def supervised_per_record(mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each record's supervised targets (its label mask without the first token)."""
    total = np.concatenate([[0], np.cumsum(np.asarray(mask, np.int64))])
    return total[offsets[1:]] - total[offsets[:-1] + 1]


class Validation:
    """The held-out split as fixed batches, and the loss over its supervised tokens."""

    def __init__(self, directory: str, seq_len: int, pad_id: int, packed: bool,
                 batch_size: int):
        ids, mask, offsets = (np.load(Path(directory) / f"val_{part}.npy", mmap_mode="r")
                              for part in ("ids", "mask", "offsets"))
        positions = np.diff(np.asarray(offsets, np.int64)) - 1
        check_fits(positions, seq_len, "held-out")
        order = np.arange(len(positions), dtype=np.int64)
        self.plan = lay_out(order, positions, seq_len, "packed" if packed else "padded")
        self.reader = RowReader(directory, "val", self.plan, seq_len, pad_id, packed)
        self.batch_size = batch_size
        per_record = supervised_per_record(np.asarray(mask), np.asarray(offsets, np.int64))
        per_row = np.asarray([per_record[self.plan.row(r)].sum() for r in range(self.plan.rows)])
        per_row = np.concatenate([per_row, np.zeros(-len(per_row) % batch_size, np.int64)])
        # supervised targets of each global batch: what weighs its mean
        self.counts = per_row.reshape(-1, batch_size).sum(axis=1)

    def batches(self) -> list[dict[str, np.ndarray]]:
        """This host's rows of each global batch."""
        p, n, host_batch = _hosts(self.batch_size)
        rows = np.arange(len(self.counts) * self.batch_size)[p::n]
        return [self.reader(rows[i:i + host_batch]) for i in range(0, len(rows), host_batch)]

    def loss(self, batch_means) -> float:
        """The mean over every supervised target, from the per-batch masked means."""
        means = np.asarray(batch_means, np.float64)
        weights = np.maximum(self.counts, 1)  # the masked mean's own denominator
        return float(np.sum(means * weights) / max(int(self.counts.sum()), 1))
