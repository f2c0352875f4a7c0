"""Prompts to completions: batches through a :class:`Decoder`, each row ended
by EOS, a stop string, its token budget or the window, timed.  The next step
is dispatched before the last one's tokens are read, so the host's work
overlaps the device's (a batch runs one step past its end, dropped)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
from tqdm import tqdm

from depthbench.generation.buckets import bucket_for
from depthbench.generation.decoder import Decoder, Rows


@dataclasses.dataclass(frozen=True)
class Completion:
    """A prompt's new tokens (EOS left out), their text cut before the first
    stop string, and why it ended: ``eos``, ``stop``, ``length`` (the token
    budget) or ``window`` (the row filled the model's window)."""

    ids: tuple[int, ...]
    text: str
    stop_reason: str


@dataclasses.dataclass
class Timing:
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    first_token_seconds: list[float] = dataclasses.field(default_factory=list)  # per batch
    new_tokens: int = 0  # tokens chosen by decode steps (each row's first is the prefill's)
    decode_seconds: float = 0.0
    compile_seconds: float = 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.new_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def time_to_first_token(self) -> float:
        """Median over batches, seconds."""
        return statistics.median(self.first_token_seconds) if self.first_token_seconds else 0.0

    def summary(self) -> str:
        return (f"time to first token {1e3 * self.time_to_first_token:.1f} ms (median of "
                f"{len(self.first_token_seconds)} batch(es)); prefill "
                f"{self.prefill_tokens_per_second:,.0f} tok/s ({self.prompt_tokens} prompt "
                f"tokens); decode {self.decode_tokens_per_second:,.1f} tok/s ({self.new_tokens} "
                f"tokens); compile {self.compile_seconds:.1f} s (not counted)")


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest occurrence of any stop string."""
    cut = len(text)
    for s in stop:
        if s:
            at = text.find(s)
            if at >= 0:
                cut = min(cut, at)
    return text[:cut]


class _Row:
    """One prompt's progress while its batch decodes."""

    def __init__(self, prompt_len: int, max_new: int, size: int):
        self.ids: list[int] = []
        self.reason = ""
        # Decode steps feed positions prompt_len .. size - 1: at most this many tokens.
        self.budget = min(max_new, size - prompt_len + 1)
        self.window_bound = self.budget < max_new

    def take(self, token: int, eos_id: int | None, stop: Sequence[str],
             detokenize: Callable[[list[int]], str] | None) -> None:
        if token == eos_id:
            self.reason = "eos"
            return
        self.ids.append(token)
        if stop and detokenize is not None and any(s and s in detokenize(self.ids) for s in stop):
            self.reason = "stop"
        elif len(self.ids) >= self.budget:
            self.reason = "window" if self.window_bound else "length"


def generate(decoder: Decoder, prompts: Sequence[Sequence[int]], *, max_new: int,
             batch_size: int = 8, seed: int = 0, stop: Sequence[str] = (),
             eos_id: int | None = None, detokenize: Callable[[list[int]], str] | None = None,
             progress: bool = True, desc: str = "generating"
             ) -> tuple[list[Completion], Timing]:
    """Completions of ``prompts`` (token ids, each 1 to ``decoder.window``), in
    batches of ``batch_size`` in the given order, and their :class:`Timing`."""
    if max_new < 1:
        raise ValueError(f"max_new: {max_new} must be at least 1")
    timing = Timing()
    out: list[Completion] = []
    compiled_before = decoder.compile_seconds
    with tqdm(total=len(prompts) * max_new, desc=desc, unit="tok", disable=not progress) as bar:
        for start in range(0, len(prompts), batch_size):
            group = [list(p) for p in prompts[start:start + batch_size]]
            rows = _decode_batch(decoder, group, range(start, start + len(group)), max_new,
                                 seed, stop, eos_id, detokenize, timing, bar)
            out += [Completion(tuple(r.ids), cut_at_stop(detokenize(r.ids), stop)
                               if detokenize else "", r.reason) for r in rows]
    timing.compile_seconds = decoder.compile_seconds - compiled_before
    return out, timing


def _decode_batch(decoder, group, row_ids, max_new, seed, stop, eos_id, detokenize,
                  timing: Timing, bar) -> list[_Row]:
    size = bucket_for(min(max(map(len, group)) + max_new, decoder.window), decoder.window)
    rows = [_Row(len(p), max_new, size) for p in group]

    def absorb(state: Rows) -> None:
        tokens = np.asarray(state.tokens_b)
        for row, token in zip(rows, tokens, strict=False):
            if not row.reason:
                counted = len(row.ids)
                row.take(int(token), eos_id, stop, detokenize)
                # A row that ended counts its whole budget: the bar ends full.
                bar.update(max_new - counted if row.reason else 1)

    # Compilation (a program's first use) runs before its dispatch: its
    # seconds are taken off the times measured around the calls.
    t0, compiled0 = time.perf_counter(), decoder.compile_seconds
    state = decoder.start(group, size, seed=seed, row_ids=list(row_ids))
    absorb(state)  # waits for the first tokens
    first = time.perf_counter() - t0 - (decoder.compile_seconds - compiled0)
    timing.first_token_seconds.append(first)
    timing.prefill_seconds += first
    timing.prompt_tokens += sum(map(len, group))
    # Steps the batch may take: the largest budget, less the prefill's token.
    steps_left = max(r.budget for r in rows) - 1
    t1, compiled1 = time.perf_counter(), decoder.compile_seconds
    before = sum(len(r.ids) for r in rows)
    live = steps_left > 0 and not all(r.reason for r in rows)
    inflight = decoder.advance(state) if live else None
    while inflight is not None:
        steps_left -= 1
        ahead = decoder.advance(inflight) if steps_left > 0 else None
        absorb(inflight)
        inflight = None if all(r.reason for r in rows) else ahead
    timing.decode_seconds += time.perf_counter() - t1 - (decoder.compile_seconds - compiled1)
    timing.new_tokens += sum(len(r.ids) for r in rows) - before
    return rows
