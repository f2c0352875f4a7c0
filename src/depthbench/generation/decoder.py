"""A run's prefill and decode programs: jitted, sharded like the train step,
one per batch and length bucket.  The next token is chosen inside the
program, so neither logits nor cache leave the device; a decode step donates
its cache; compilation is timed apart (``compile_seconds``)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding

from depthbench import parallel
from depthbench.generation.buckets import bucket_for
from depthbench.generation.sampling import GREEDY, Sampling, choose
from depthbench.model import decode
from depthbench.model.past_attention import CACHE_AXES, KVCache


@dataclasses.dataclass
class Rows:
    """A batch being decoded: its cache, the logits and tokens its last call
    chose (on the device), how many steps it has taken and each row's id (the
    prompt index: its sampling key)."""

    cache: KVCache
    logits_bv: jax.Array
    tokens_b: jax.Array
    steps: int
    row_ids_b: np.ndarray
    seed: np.uint32

    @property
    def size(self) -> int:
        """The cache's slots per row."""
        return int(self.cache.k_lbksh.shape[3])


class Decoder:
    """Prefill and decode on ``run`` with ``sampling`` (see the module docstring).

    ``window``: the most tokens a row may hold (default: the run's
    ``train.seq_len``)."""

    def __init__(self, run, sampling: Sampling = GREEDY, *, window: int | None = None):
        self.run, self.sampling = run, sampling
        self.window = int(window or run.config.train.seq_len)
        self.shards = parallel.batch_shards(run.mesh)
        self.compile_seconds = 0.0
        self._programs: dict[tuple, object] = {}
        self._batch1 = parallel.batch_sharding(run.mesh, 1)
        self._batch2 = parallel.batch_sharding(run.mesh, 2)
        self._rep = parallel.replicated(run.mesh)

    @property
    def programs(self) -> dict[tuple, object]:
        """The programs compiled so far (``jax.stages.Compiled``), by kind and shape."""
        return dict(self._programs)

    def rows(self, n: int) -> int:
        """The batch a program is compiled for: ``n`` rounded up to the batch shards."""
        return -(-max(1, int(n)) // self.shards) * self.shards

    def cache_shardings(self, rows: int, size: int) -> KVCache:
        """Where the cache of ``rows`` x ``size`` slots lives (the carry, if any,
        where the program puts it)."""
        s, mesh = self.run.spec, self.run.mesh
        shape = (s.depth, rows, s.n_kv_heads, size, s.head_dim)
        kv = NamedSharding(mesh, parallel.spec_for(CACHE_AXES, shape, mesh, self.run.rules))
        return KVCache(kv, kv, self._batch1, None)

    def _compiled(self, key: tuple, build, args):
        """The program ``key``, lowered and compiled on its first use (timed apart)."""
        if key not in self._programs:
            t0 = time.perf_counter()
            with self.run.context():
                self._programs[key] = build().lower(*args).compile()
            self.compile_seconds += time.perf_counter() - t0
        return self._programs[key]

    def _prefill_program(self, rows: int, size: int):
        model, sampling = self.run.model, self.sampling

        def run(params, tokens_bp, lengths_b, seed, row_ids_b):
            logits_bv, cache = decode.prefill(model, params, tokens_bp, lengths_b, size)
            return logits_bv, choose(logits_bv, sampling, seed, 0, row_ids_b), cache

        return jax.jit(run, in_shardings=(self.run.param_shardings, self._batch2, self._batch1,
                                          self._rep, self._batch1),
                       out_shardings=(self._batch2, self._batch1,
                                      self.cache_shardings(rows, size)))

    def _step_program(self, rows: int, size: int):
        model, sampling = self.run.model, self.sampling
        cache_sh = self.cache_shardings(rows, size)

        def run(params, cache, tokens_b, seed, step, row_ids_b):
            logits_bv, cache = decode.decode_step(model, params, cache, tokens_b[:, None])
            return logits_bv, choose(logits_bv, sampling, seed, step, row_ids_b), cache

        return jax.jit(run, in_shardings=(self.run.param_shardings, cache_sh, self._batch1,
                                          self._rep, self._rep, self._batch1),
                       out_shardings=(self._batch2, self._batch1, cache_sh),
                       donate_argnums=(1,))

    def start(self, prompts: Sequence[Sequence[int]], size: int, *, seed: int = 0,
              row_ids: Sequence[int] | None = None) -> Rows:
        """Prefill ``prompts`` (token ids, 1 to ``size`` each) into a cache of ``size``
        slots per row; the first new token of each row is chosen (asynchronously:
        reading ``tokens_b`` waits for it).  Rows past ``len(prompts)`` pad the batch."""
        lengths = [len(p) for p in prompts]
        if not prompts or min(lengths) < 1 or max(lengths) > size or size > self.window:
            raise ValueError(f"prompts of {min(lengths, default=0)} to {max(lengths, default=0)} "
                             f"tokens into {size} slots (window {self.window})")
        rows = self.rows(len(prompts))
        width = bucket_for(max(lengths), size)
        tokens = np.zeros((rows, width), np.int32)
        length_b = np.ones(rows, np.int32)
        for r, ids in enumerate(prompts):
            tokens[r, :len(ids)] = ids
            length_b[r] = len(ids)
        ids_b = np.arange(rows, dtype=np.int32) if row_ids is None else np.concatenate(
            [np.asarray(row_ids, np.int32), np.zeros(rows - len(prompts), np.int32)])
        args = (self.run.params, tokens, length_b, np.uint32(seed), ids_b)
        program = self._compiled(("prefill", rows, width, size),
                                 lambda: self._prefill_program(rows, size), args)
        with self.run.context():
            logits, chosen, cache = program(*args)
        return Rows(cache, logits, chosen, 0, ids_b, np.uint32(seed))

    def advance(self, rows: Rows, tokens_b=None) -> Rows:
        """One decode step: each row is fed the token its last call chose (or
        ``tokens_b``, one per row: teacher forcing) and chooses the next.  The
        cache of ``rows`` is donated: use the returned one."""
        fed = rows.tokens_b if tokens_b is None else np.asarray(tokens_b, np.int32)
        step = np.int32(rows.steps + 1)
        args = (self.run.params, rows.cache, fed, rows.seed, step, rows.row_ids_b)
        program = self._compiled(("step", int(rows.tokens_b.shape[0]), rows.size),
                                 lambda: self._step_program(int(rows.tokens_b.shape[0]),
                                                            rows.size), args)
        with self.run.context():
            logits, chosen, cache = program(*args)
        return Rows(cache, logits, chosen, rows.steps + 1, rows.row_ids_b, rows.seed)
