"""Which records each training row holds, for every step of a fine-tuning run.

A record of ``n`` tokens is ``n - 1`` positions (inputs ``ids[:-1]``,
targets ``ids[1:]``).  Epoch ``e`` visits the training records in the
order ``default_rng(seed + e).permutation(n)`` (a new shuffle each epoch, as
a ``RandomSampler`` gives); a fractional last epoch takes the start of its
order.  The epochs' records are then laid into rows of ``seq_len``
positions:

* ``padded``: one record per row, padded to ``seq_len``;
* ``packed``: as many whole records as fit, in order (a record never split
  across rows; the next row starts when the next record does not fit).

A batch is ``batch_size`` consecutive rows, so a run is ``ceil(rows /
batch_size)`` steps; the rows past the last one in the final batch are
empty (no supervised token).  The plan is index arithmetic fixed by the
record lengths, the layout and the seed: a resumed run rebuilds it and its
data position picks up where it stopped.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from depthbench.errors import ConfigError

LAYOUTS = ("padded", "packed")


@dataclasses.dataclass(frozen=True)
class RowPlan:
    """Row ``r`` holds records ``members[starts[r]:starts[r + 1]]`` (CSR)."""

    starts: np.ndarray  # int64 [rows + 1]
    members: np.ndarray  # int64: record indices, rows concatenated

    @property
    def rows(self) -> int:
        return len(self.starts) - 1

    def row(self, r: int) -> np.ndarray:
        """The records of row ``r`` (none for a row past the plan's end)."""
        if r >= self.rows:
            return self.members[:0]
        return self.members[self.starts[r]:self.starts[r + 1]]

    def steps(self, batch_size: int) -> int:
        return math.ceil(self.rows / batch_size)


def epoch_order(n_records: int, epochs: float, seed: int) -> np.ndarray:
    """The records in the order the run visits them, epochs concatenated."""
    whole, part = int(epochs), epochs - int(epochs)
    orders = [np.random.default_rng(seed + e).permutation(n_records) for e in range(whole)]
    if part > 0:
        orders.append(np.random.default_rng(seed + whole).permutation(n_records)[
            :math.ceil(part * n_records)])
    return np.concatenate(orders).astype(np.int64) if orders else np.zeros(0, np.int64)


def check_fits(positions: np.ndarray, seq_len: int, what: str) -> None:
    """Every record's positions fit one row (one line naming the longest if not)."""
    longest = int(positions.max(initial=0))
    if longest > seq_len:
        raise ConfigError(f"config.train.seq_len: the longest {what} record is {longest + 1} "
                          f"tokens ({longest} positions), more than a row of {seq_len}; set "
                          f"train.seq_len >= {longest} or finetune.max_seq_len <= "
                          f"{seq_len + 1}")


def lay_out(order: np.ndarray, positions: np.ndarray, seq_len: int, layout: str) -> RowPlan:
    """The rows of ``order`` (``positions[i]``: record ``i``'s positions)."""
    if layout not in LAYOUTS:
        raise ConfigError(f"config.finetune.layout: {layout!r} is not one of "
                          f"{', '.join(LAYOUTS)}")
    if layout == "padded":
        return RowPlan(np.arange(len(order) + 1, dtype=np.int64), order)
    starts, used = [0], 0
    for k, n in enumerate(positions[order].tolist()):
        if used + n > seq_len:  # this record opens the next row
            starts.append(k)
            used = 0
        used += n
    if len(order):
        starts.append(len(order))
    return RowPlan(np.asarray(starts, np.int64), order)


def plan(offsets: np.ndarray, *, epochs: float, seed: int, seq_len: int,
         layout: str) -> RowPlan:
    """The training rows of a split whose records start at ``offsets``."""
    positions = np.diff(np.asarray(offsets, np.int64)) - 1
    check_fits(positions, seq_len, "training")
    return lay_out(epoch_order(len(positions), epochs, seed), positions, seq_len, layout)
