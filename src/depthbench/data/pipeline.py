"""The grain input pipeline: windows of a flat token array, shuffled, sharded, batched.

Windows, the epoch shuffle, how hosts partition the global batch and the
validation windows: docs/DATA.md, "The grain pipeline".  It is all index
arithmetic in a grain ``MapDataset`` (nothing materialised), so the
iterator's state is one integer per host and restoring it resumes exactly."""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

import numpy as np

from depthbench.data import token_cache
from depthbench.errors import ConfigError

if TYPE_CHECKING:
    import grain


def window_count(n_tokens: int, seq_len: int) -> int:
    """Windows of ``seq_len + 1`` tokens at stride ``seq_len`` in ``n_tokens`` tokens."""
    return max(0, (n_tokens - 1) // seq_len)


class WindowReader:
    """Maps a batch of window indices to ``{"inputs", "targets"}`` int32 arrays.

    Holds the path, not the memmap, when pickled (grain worker processes
    re-open the file themselves).
    """

    def __init__(self, path: str, seq_len: int):
        self.path, self.seq_len = path, seq_len
        self._tokens = None
        # The prefetch threads call the reader at once; the first calls must
        # open the file once, not race to parse its header (see open_tokens).
        self._open_lock = threading.Lock()
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    def __getstate__(self):
        return {"path": self.path, "seq_len": self.seq_len}

    def __setstate__(self, state):
        self.__init__(state["path"], state["seq_len"])

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            with self._open_lock:
                if self._tokens is None:
                    self._tokens = token_cache.open_tokens(self.path, field="data.cache_dir")
        return self._tokens

    def __call__(self, window_ids) -> dict[str, np.ndarray]:
        starts = np.asarray(window_ids, dtype=np.int64) * self.seq_len
        rows = np.asarray(self.tokens[starts[:, None] + self._offsets], dtype=np.int32)
        return {
            "inputs": np.ascontiguousarray(rows[:, :-1]),
            "targets": np.ascontiguousarray(rows[:, 1:]),
        }


def _hosts(config, process_index, process_count) -> tuple[int, int, int]:
    """(process_index, process_count, per-host batch) with jax's defaults."""
    if process_index is None or process_count is None:
        import jax  # here, not at the top: tokenising and preparing data need no jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    batch = config.train.batch_size
    if batch % process_count:
        raise ConfigError(
            f"config.train.batch_size: {batch} is not divisible by the {process_count} "
            "processes (each host loads batch_size / process_count sequences)"
        )
    return process_index, process_count, batch // process_count


def _too_short(split: str, n_tokens: int, seq_len: int) -> ConfigError:
    return ConfigError(
        f"config.train.seq_len: windows of {seq_len} + 1 tokens do not fit in the {split} "
        f"split ({n_tokens} tokens); lower train.seq_len or add data (data.val_fraction)"
    )


def val_window_ids(config, n_tokens: int) -> np.ndarray:
    """The global, ordered list of validation window indices."""
    seq_len, batch = config.train.seq_len, config.train.batch_size
    available = window_count(n_tokens, seq_len)
    if available == 0:
        raise _too_short("validation", n_tokens, seq_len)
    needed = math.ceil(config.data.val_windows / batch) * batch
    # data.val_windows is an upper bound: a small corpus's validation split is
    # evaluated on as many whole batches as it holds (so a user's own small
    # corpus trains with the defaults), never on repeated windows.
    needed = min(needed, (available // batch) * batch)
    if needed == 0:
        raise ConfigError(
            f"config.train.batch_size: the validation split holds {available} windows of "
            f"{seq_len} + 1 tokens, fewer than one batch of {batch}; raise data.val_fraction, "
            "add data, or lower train.batch_size or train.seq_len"
        )
    return (np.arange(needed, dtype=np.int64) * available) // needed  # evenly spaced, distinct


def check_windows(config, prepared) -> None:
    """Raise the ConfigError train_iterator / val_batches would raise for this config."""
    if window_count(prepared.train_tokens, config.train.seq_len) == 0:
        raise _too_short("training", prepared.train_tokens, config.train.seq_len)
    val_window_ids(config, prepared.val_tokens)


def train_dataset(config, prepared, *, process_index=None, process_count=None) -> grain.IterDataset:
    """The host-local training batches as a grain ``IterDataset`` (infinite)."""
    import grain  # with Orbax and jax, a second of start-up that tokenising does not need

    p, n, host_batch = _hosts(config, process_index, process_count)
    seq_len = config.train.seq_len
    windows = window_count(prepared.train_tokens, seq_len)
    if windows == 0:
        raise _too_short("training", prepared.train_tokens, seq_len)
    d = config.data
    ds = (
        grain.MapDataset.range(windows)
        .shuffle(seed=d.shuffle_seed)  # epoch e uses seed + e (grain folds the epoch in)
        .repeat(None)
        .slice(slice(p, None, n))
        .batch(host_batch, drop_remainder=True)
        .map(WindowReader(prepared.train_tokens_path, seq_len))
    )
    threads = min(d.prefetch, 2)
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=d.prefetch))
    if d.worker_count > 0:
        _absl_flags_ready()
        it = it.mp_prefetch(
            grain.MultiprocessingOptions(
                num_workers=d.worker_count, per_worker_buffer_size=max(1, d.prefetch)
            )
        )
    return it


def _absl_flags_ready() -> None:
    """grain 0.2.x's worker processes read absl flags, which raise unless parsed (grain
    issue #1355); a program not started by ``absl.app`` has never parsed them."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def train_iterator(config, prepared, *, process_index=None, process_count=None):
    """An infinite iterator of host-local batches ``{"inputs", "targets"}``: int32 [B_host, T].

    A grain ``DatasetIterator``: ``get_state()`` / ``set_state()`` checkpoint its
    position, and :func:`checkpoint_save_arg` puts it into an Orbax checkpoint.
    """
    return iter(
        train_dataset(config, prepared, process_index=process_index, process_count=process_count)
    )


def val_batches(config, prepared, *, process_index=None, process_count=None) -> list[dict]:
    """The fixed validation batches of this host (same format as training batches)."""
    p, n, host_batch = _hosts(config, process_index, process_count)
    ids = val_window_ids(config, prepared.val_tokens)[p::n]
    reader = WindowReader(prepared.val_tokens_path, config.train.seq_len)
    return [reader(ids[i : i + host_batch]) for i in range(0, len(ids), host_batch)]


def checkpoint_save_arg(iterator):
    """Orbax ``args`` saving the iterator's position (an item of ``ocp.args.Composite``)."""
    import grain.checkpoint as gc

    return gc.CheckpointSave(iterator)


def checkpoint_restore_arg(iterator):
    """Orbax ``args`` restoring a checkpointed position into ``iterator`` (in place)."""
    import grain.checkpoint as gc

    return gc.CheckpointRestore(iterator)
