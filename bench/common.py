"""Shared pieces of the benchmark suite: the header every table carries, the
interleaved timer, and building a depthbench train step at an explicit shape.

Timing on a shared machine: the stacks being compared run their repetitions
interleaved (A, B, A, B ...), so load changes hit both alike, and a table
reports the median of each and their ratio, never one number alone.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from depthbench import hostmem

ROOT = Path(__file__).resolve().parents[1]


# Settings that change step times (glibc's tunables alone moved the CPU train
# step by 9-15%: README, Performance): a table headed without them ran without.
STEP_ENV = ("XLA_FLAGS", "GLIBC_TUNABLES", "OMP_NUM_THREADS", "LD_PRELOAD")


def header(title: str) -> str:
    """The title, then one line naming the machine, the load, the jax version, the
    date, the host-memory setting (``bench/__init__.py``) and any of ``STEP_ENV`` set."""
    import jax

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    line = (f"== {title} ==\n{platform.processor() or platform.machine()}, {cores} cores, "
            f"load {load:.1f}; jax {jax.__version__} ({jax.default_backend()}); {now}; "
            f"host malloc: {hostmem.status()}")
    return line + "".join(f"; {k}={os.environ[k]}" for k in STEP_ENV if os.environ.get(k))


def table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """A markdown table of ``rows`` (dicts with the same keys)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0])
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return str(v)


def interleaved(fns: dict[str, Callable[[], None]], reps: int, pause: float = 0.0,
                warm: bool = False) -> dict[str, float]:
    """Median seconds per call of each ``fn``, calls interleaved A, B, A, B ...

    Each ``fn`` must block until its work is done.  Idle worker threads spin
    for a while after a call (torch's OpenMP threads do) and slow whatever runs
    next on the same cores: a jax matmul right after a torch one ran at 185
    against 252 GFLOP/s alone on a 2-core Xeon.  Two remedies: ``pause``
    seconds of sleep before each timed call (for calls long against the
    sleep's own wake-up cost), or ``warm``: one untimed call of the same ``fn``
    right before each timed one (for short calls)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            time.sleep(pause)
            if warm:
                fn()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def config_at(d_model: int, depth: int, seq_len: int, batch: int, vocab: int, *,
              family: str = "pre_ln", n_heads: int = 0, overrides: Sequence[str] = ()):
    """The micro spec at an explicit shape (fp32; its remat policy,
    ``matmuls_saveable``: no matmul recomputed), validated."""
    from depthbench import config as config_lib

    heads = n_heads or max(2, d_model // 64)  # >= 2: moda+lean's kv heads (2) must divide it
    fields = {
        "model.family": family, "model.depth": depth, "model.d_model": d_model,
        "model.n_heads": heads, "model.vocab_size": vocab, "model.suite": "",
        "train.seq_len": seq_len, "train.batch_size": batch,
    }
    args = [f"--config.{k}={v}" for k, v in fields.items()] + list(overrides)
    return config_lib.load("micro", args)


class DepthbenchStep:
    """The trainer's own ``setup`` + ``make_train_step`` at a config, with a
    random batch; calling it runs one step and blocks on its metrics.

    ``allocate=False`` leaves the train state uncreated until the first call
    (or :meth:`allocate`): :meth:`compile` and :meth:`memory_bytes` work from
    the abstract state, so many steps can be compiled (in threads, even)
    without holding their parameters on the device at once."""

    def __init__(self, config, seed: int = 0, allocate: bool = True):
        import jax
        import numpy as np

        from depthbench import parallel
        from depthbench.train import state as state_lib
        from depthbench.train import step as step_lib

        self.config = config
        self.setup = state_lib.setup(config, parallel.mesh_from_config(config))
        self.step = step_lib.make_train_step(self.setup, int(config.train.microbatches))
        self.seed = seed
        self.state = state_lib.init_state(self.setup, seed) if allocate else None
        rng = np.random.default_rng(seed)
        b, t = int(config.train.batch_size), int(config.train.seq_len)
        v = self.setup.spec.vocab_size
        tokens = rng.integers(0, v, (b, t + 1), dtype=np.int32)
        self.batch = {"inputs": jax.numpy.asarray(tokens[:, :-1]),
                      "targets": jax.numpy.asarray(tokens[:, 1:])}
        self.tokens = b * t

    def compile_seconds(self) -> float:
        """Seconds to lower and compile the step (the first call's extra cost)."""
        t0 = time.perf_counter()
        with self.setup.context():
            self.step.jitted.lower(self.state, self.batch).compile()
        return time.perf_counter() - t0

    def compile(self) -> float:
        """Lower and compile the step once and keep the executable: later calls
        run it, and :meth:`memory_bytes` reads its memory.  Returns the seconds
        it took (on an accelerator a compile is too dear to do twice)."""
        state = self.setup.abstract_state if self.state is None else self.state
        t0 = time.perf_counter()
        with self.setup.context():
            self.compiled = self.step.jitted.lower(state, self.batch).compile()
        return time.perf_counter() - t0

    def allocate(self) -> None:
        """Create the train state (parameters, optimizer state) if not yet there."""
        from depthbench.train import state as state_lib

        if self.state is None:
            self.state = state_lib.init_state(self.setup, self.seed)

    def release(self) -> None:
        """Drop the train state (its device memory); a later call creates it anew."""
        self.state = None

    def memory_bytes(self) -> int:
        """XLA's account of the compiled step (:func:`compiled_memory_bytes`)."""
        if getattr(self, "compiled", None) is None:
            self.compile()
        return compiled_memory_bytes(self.compiled)

    def __call__(self) -> None:
        import jax

        self.allocate()
        if getattr(self, "compiled", None) is not None:
            self.state, metrics = self.compiled(self.state, self.batch)
        else:
            self.state, metrics = self.step(self.state, self.batch)
        jax.block_until_ready(metrics)
        self.metrics = metrics


def compiled_memory_bytes(compiled) -> int:
    """Arguments + outputs + temporaries - aliased (donated) bytes of a compiled
    program, from XLA's ``memory_analysis`` (0 where the backend gives none).
    It does not depend on machine load, unlike a step time."""
    m = compiled.memory_analysis()
    if m is None:
        return 0
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)
