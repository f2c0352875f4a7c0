"""Completion scoring and greedy generation on a loaded run, in a few compiled shapes.

:class:`Scorer` gives an evaluation ``loglikelihood`` (targets after contexts),
``rolling`` and greedy ``generate``.  Inputs are padded to length buckets and a
fixed batch, one program per bucket; padding cannot leak (causal attention,
padded positions never read).  Windows and buckets: docs/EVAL.md."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from tqdm import tqdm

from depthbench import parallel
from depthbench.errors import ConfigError
from depthbench.generation.buckets import MIN_BUCKET, bucket_for
from depthbench.generation.decoder import Decoder
from depthbench.generation.loop import generate


@dataclasses.dataclass(frozen=True)
class Window:
    """One model input: ``inputs`` [n], next-token ``targets`` [n]; the last
    ``n_scored`` predictions count towards request ``owner``."""

    owner: int
    inputs: tuple[int, ...]
    targets: tuple[int, ...]
    n_scored: int


def target_windows(owner: int, context: Sequence[int], target: Sequence[int],
                   max_length: int, *, from_end: bool = True) -> list[Window]:
    """The windows that score every token of ``target`` after ``context``.

    Target positions are cut into runs of at most ``max_length``, from the end
    (``from_end``: the last run sees the most context, and a target that fits
    gets lm-eval's left-truncated input) or from the start (lm-eval's rolling
    windows).  Each run's input is the ``max_length`` tokens before its end."""
    if not context:
        raise ValueError("context: at least one token (a prefix token for an empty prompt)")
    if not target:
        raise ValueError("target: empty; a completion needs at least one token to score")
    full = list(context) + list(target)
    first, total = len(context), len(full)  # predicted positions: first .. total-1
    if from_end:
        ends = list(range(total, first, -max_length))[::-1]
    else:
        ends = [min(total, s + max_length) for s in range(first, total, max_length)]
    out, start = [], first
    for end in ends:
        lo = max(0, end - 1 - max_length)  # input full[lo : end-1] predicts full[lo+1 : end]
        start = max(first, end - max_length) if from_end else start
        out.append(Window(owner, tuple(full[lo:end - 1]), tuple(full[lo + 1:end]), end - start))
        start = end
    return out


def _memory_bytes(mesh) -> int | None:
    """What the mesh's devices can hold: their memory limits (accelerators), else
    the host's physical memory (CPU devices report none); None if unknown."""
    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in mesh.devices.flat]
    if all(limits):
        return int(sum(limits))
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def check_batch_fits(run, batch_size: int, max_length: int) -> int:
    """The batch a Scorer of ``run`` compiles (``batch_size`` rounded up to the
    mesh's batch shards), or ConfigError when its float32 logits alone, at the
    shortest padded length, exceed the memory there is: every call would fail,
    so the request is refused up front."""
    shards = parallel.batch_shards(run.mesh)
    batch = -(-max(1, int(batch_size)) // shards) * shards
    length, vocab = min(MIN_BUCKET, int(max_length)), int(run.spec.vocab_size)
    need, have = 4 * batch * length * vocab, _memory_bytes(run.mesh)
    if have is not None and need > have:
        raise ConfigError(
            f"--batch-size: {batch} sequences of {length} tokens need {need / 2**30:.0f} GiB "
            f"for their logits alone (vocabulary {vocab}); the devices have "
            f"{have / 2**30:.0f} GiB: lower the batch size")
    return batch


class Scorer:
    """Scoring and greedy generation on ``run`` (see the module docstring)."""

    def __init__(self, run, *, batch_size: int = 8, max_length: int | None = None,
                 progress: bool = True):
        self.run = run
        self.max_length = int(max_length or run.config.train.seq_len)
        self.batch_size = check_batch_fits(run, batch_size, self.max_length)
        self.progress = progress
        self.compiled_shapes: set[tuple[str, int, int]] = set()
        batch = parallel.batch_sharding(run.mesh)
        model = run.model

        def score(params, tokens_bt, targets_bt):
            logits = model.apply({"params": params}, tokens_bt)[0].astype(jnp.float32)
            logp = jax.nn.log_softmax(logits, axis=-1)
            target_logp = jnp.take_along_axis(logp, targets_bt[..., None], axis=-1)[..., 0]
            return target_logp, jnp.argmax(logits, axis=-1) == targets_bt

        self._batch = batch  # where _call puts its numpy inputs
        self._score = jax.jit(score, in_shardings=(run.param_shardings, batch, batch),
                              out_shardings=(batch, batch))
        self.decoder = Decoder(run, window=self.max_length)

    def _call(self, fn: Callable, kind: str, *arrays: np.ndarray):
        self.compiled_shapes.add((kind,) + arrays[0].shape)
        with jax.set_mesh(self.run.mesh), nn.logical_axis_rules(list(self.run.rules)):
            # Placed as the jit expects (jnp.asarray would compile a copy program per shape).
            placed = (jax.device_put(a, self._batch) for a in arrays)
            return jax.device_get(fn(self.run.params, *placed))

    def loglikelihood(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                      desc: str = "scoring", from_end: bool = True
                      ) -> list[tuple[float, bool, int]]:
        """``(sum log p(target | context), all greedy, n target tokens)`` per pair."""
        windows = [w for i, (ctx, tgt) in enumerate(pairs)
                   for w in target_windows(i, ctx, tgt, self.max_length, from_end=from_end)]
        logp = np.zeros(len(pairs), np.float64)
        greedy = np.ones(len(pairs), bool)
        order = sorted(range(len(windows)), key=lambda k: -len(windows[k].inputs))
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        for idx in tqdm(batches, desc=desc, unit="batch", disable=not self.progress):
            group = [windows[k] for k in idx]
            T = bucket_for(len(group[0].inputs), self.max_length)
            tokens = np.zeros((self.batch_size, T), np.int32)
            targets = np.zeros((self.batch_size, T), np.int32)
            for r, w in enumerate(group):
                tokens[r, :len(w.inputs)] = w.inputs
                targets[r, :len(w.targets)] = w.targets
            lp, ok = self._call(self._score, "score", tokens, targets)
            for r, w in enumerate(group):
                n = len(w.inputs)
                logp[w.owner] += float(np.sum(lp[r, n - w.n_scored:n], dtype=np.float64))
                greedy[w.owner] &= bool(np.all(ok[r, n - w.n_scored:n]))
        return [(float(logp[i]), bool(greedy[i]), len(pairs[i][1])) for i in range(len(pairs))]

    def rolling(self, texts_ids: Sequence[Sequence[int]], prefix_id: int, *,
                desc: str = "scoring") -> list[float]:
        """Log-likelihood of each whole token sequence, conditioned on ``prefix_id`` only."""
        pairs = [([prefix_id], list(ids)) for ids in texts_ids]
        out = [0.0] * len(pairs)
        live = [i for i, (_, ids) in enumerate(pairs) if ids]
        scored = self.loglikelihood([pairs[i] for i in live], desc=desc, from_end=False)
        for i, (lp, _, _) in zip(live, scored, strict=True):
            out[i] = lp
        return out

    def generate(self, contexts: Sequence[Sequence[int]], *, max_new: int,
                 stop: Sequence[str], decode: Callable[[list[int]], str], eos_id: int,
                 desc: str = "generating") -> list[str]:
        """Greedy continuations (text), each cut before its first stop string.

        A context is cut from the left to ``max_length - max_new`` tokens;
        generation also ends at ``eos_id`` or when the window is full."""
        if max_new < 1 or max_new >= self.max_length:
            raise ValueError(f"max_gen_toks: {max_new} must be in [1, max_length "
                             f"{self.max_length})")
        keep = self.max_length - max_new
        ctxs = [list(c)[-keep:] for c in contexts]
        if any(not c for c in ctxs):
            raise ValueError("context: empty; give at least one token (e.g. the prefix token)")
        # Longest first, so each batch's rows share a length bucket.
        order = sorted(range(len(ctxs)), key=lambda k: -len(ctxs[k]))
        done, _ = generate(self.decoder, [ctxs[k] for k in order], max_new=max_new,
                           batch_size=self.batch_size, stop=stop, eos_id=eos_id,
                           detokenize=decode, progress=self.progress, desc=desc)
        for first in order[::self.batch_size]:  # each batch's longest context sets its bucket
            self.compiled_shapes.add(("generate", self.batch_size,
                                      bucket_for(len(ctxs[first]) + max_new, self.max_length)))
        results: list[str] = [""] * len(ctxs)
        for k, c in zip(order, done, strict=True):
            results[k] = c.text
        return results
