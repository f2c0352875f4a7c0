"""A fine-tuning's plan: its config, the records each training row holds, and
those rows as batches (docs/FINETUNE.md).

The parent gives the ``model`` and ``data`` sections (but how the model runs,
:data:`RUNTIME_FIELDS`), the spec and overrides the rest; the parent, the data
digest and the steps are in the run's identity, so it resumes only on them."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Sequence
from pathlib import Path

import grain
import jax
import ml_collections
import numpy as np

from depthbench import config as config_lib
from depthbench.errors import ConfigError
from depthbench.finetune.records import OPTIONS, SFTData, prepare_sft
from depthbench.run import RunDir, open_run

WHAT = "finetune"
LAYOUTS = ("padded", "packed")
# model.* and data.* fields a fine-tuning sets itself: how the model runs, not what it is.
RUNTIME_FIELDS = ("model.compute_dtype", "model.remat_policy", "model.attention_impl",
                  "model.impl", "model.scan_unroll", "model.layer_scan", "data.cache_dir",
                  "data.prefetch", "data.worker_count")
# Fields the command derives: an override of them is refused.
DERIVED = ("finetune.parent", "finetune.data_digest")
# How error lines name the records' options: the spec's fields.
FIELDS = {**{k: f"config.finetune.{k}" for k in OPTIONS}, "seed": "config.finetune.data_seed"}


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
    """The records in the order the run visits them, epochs concatenated: epoch
    ``e`` is ``default_rng(seed + e).permutation(n)``, a fractional last epoch
    the start of its order."""
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


def training_rows(offsets: np.ndarray, *, epochs: float, seed: int, seq_len: int,
                  layout: str) -> RowPlan:
    """The training rows of a split whose records start at ``offsets``."""
    positions = np.diff(np.asarray(offsets, np.int64)) - 1
    check_fits(positions, seq_len, "training")
    return lay_out(epoch_order(len(positions), epochs, seed), positions, seq_len, layout)


class RowReader:
    """Row indices -> a host batch of one split's records (``plan`` lays them out).
    A row holds its records one after another (inputs ``ids[:-1]``, targets
    ``ids[1:]``, loss mask ``m[1:]``), then padding (``pad_id``, mask off); a
    packed row also carries ``segments`` (1, 2, ... per record) and
    ``positions`` (each record from 0)."""

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
                    self._arrays = SFTData(Path(self.directory), {}).split(self.split)
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
        _, mask, offsets = SFTData(Path(directory), {}).split("val")
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


@dataclasses.dataclass
class Plan:
    """A fine-tuning, ready to run: its config, parent, data, rows and validation."""

    config: ml_collections.ConfigDict
    parent: RunDir
    data: SFTData
    rows: RowPlan
    validation: Validation

    @property
    def pad_id(self) -> int:
        return int(self.data.manifest["tokenizer"]["eos_id"])


def _given(overrides: Sequence[str]) -> set[str]:
    """The fields the overrides set: each a statement, whatever its value (one equal
    to the spec's default included)."""
    return {o.removeprefix("--").removeprefix("config.").partition("=")[0].strip()
            for o in overrides}


def _refuse_parent_fields(given: set[str]) -> None:
    """An override may not set the parent's model or tokenizer, nor a derived field."""
    for key in sorted(given):
        if key in DERIVED:
            raise ConfigError(f"--config.{key}: set by depthbench finetune (the parent's "
                              "directory and the prepared records' digest)")
        if key.startswith(("model.", "data.")) and key not in RUNTIME_FIELDS:
            raise ConfigError(f"--config.{key}: a fine-tuned run keeps its parent's model and "
                              f"tokenizer; of model.* and data.* only "
                              f"{', '.join(f.split('.', 1)[1] for f in RUNTIME_FIELDS)} may be set")


def from_parent(recipe: ml_collections.ConfigDict, parent: RunDir
                ) -> ml_collections.ConfigDict:
    """``recipe`` with the parent's model and data (but their runtime fields)."""
    out, theirs = recipe.to_dict(), parent.config.to_dict()
    for section in ("model", "data"):
        own = {f.split(".", 1)[1] for f in RUNTIME_FIELDS if f.startswith(section + ".")}
        out[section] = {**theirs[section], **{k: out[section][k] for k in own}}
    out["finetune"]["parent"] = str(parent.path)
    config = config_lib.with_family_fields(ml_collections.ConfigDict(out))
    return config_lib.validate(config)


def _check_packable(config: ml_collections.ConfigDict) -> None:
    """Packed rows keep their records apart only in the backbone's own attention and
    for a family whose state at a token depends on that token alone."""
    from depthbench.model.residual.protocol import registry
    from depthbench.model.residual.protocol.capabilities import PositionState

    m = config.model
    if m.attention_impl != "xla":
        raise ConfigError(f"config.finetune.layout: 'packed' keeps records apart with "
                          f"model.attention_impl 'xla' only, not {m.attention_impl!r}")
    if issubclass(registry.get(m.family), PositionState):
        raise ConfigError(f"config.finetune.layout: 'packed' needs a family whose state "
                          f"carries nothing across positions; {m.family} does (use 'padded')")


def with_data(config: ml_collections.ConfigDict, parent: RunDir, *, progress: bool,
              field: str, max_steps: int | None = None) -> Plan:
    """The records prepared with the parent's tokenizer, and the steps they make
    (at most ``max_steps``: a ``train.steps`` given cuts the run short)."""
    f, t = config.finetune, config.train
    if f.layout == "packed":
        _check_packable(config)
    data = prepare_sft(f.records, parent.path, max_seq_len=int(f.max_seq_len),
                       max_samples=int(f.max_samples) or None,
                       val_fraction=float(f.val_fraction), seed=int(f.data_seed),
                       cache_dir=str(config.data.cache_dir), progress=progress, field=field,
                       fields=FIELDS)
    _, _, offsets = data.split("train")
    rows = training_rows(offsets, epochs=float(f.epochs), seed=int(t.seed),
                         seq_len=int(t.seq_len), layout=str(f.layout))
    config = ml_collections.ConfigDict(config.to_dict())
    config.finetune.data_digest = data.digest
    steps = rows.steps(int(t.batch_size))
    config.train.steps = min(steps, max_steps) if max_steps else steps
    validation = Validation(str(data.directory), int(t.seq_len),
                            int(data.manifest["tokenizer"]["eos_id"]),
                            f.layout == "packed", int(t.batch_size))
    return Plan(config_lib.validate(config), parent, data, rows, validation)


def from_command(parent_dir: str | Path, records: str | Path, spec: str = "sft",
                 overrides: Sequence[str] = (), *, progress: bool = True) -> Plan:
    """``depthbench finetune PARENT --records FILE [--config SPEC] [overrides]``."""
    parent = open_run(parent_dir, WHAT)
    given = _given(overrides)
    _refuse_parent_fields(given)
    recipe = config_lib.load(spec, overrides)
    recipe.finetune.records = str(Path(records).expanduser().absolute())
    recipe.finetune.spec = str(spec)
    return with_data(from_parent(recipe, parent), parent, progress=progress, field="--records",
                     max_steps=int(recipe.train.steps) if "train.steps" in given else None)


def from_sweep_run(run_config: ml_collections.ConfigDict, run_dir: str | Path, *,
                   progress: bool = True) -> Plan:
    """The fine-tuning a sweep's run asks for: the recipe of its ``finetune.spec``,
    its own ``finetune``, ``parallel`` and ``eval`` sections."""
    parent = open_run(run_dir, WHAT)
    recipe = config_lib.load(str(run_config.finetune.spec))
    for section in ("finetune", "parallel", "eval"):
        recipe[section] = ml_collections.ConfigDict(run_config[section].to_dict())
    recipe.data.cache_dir = run_config.data.cache_dir
    return with_data(from_parent(recipe, parent), parent, progress=progress,
                     field="config.finetune.records")
