"""One training run, start to finish: ``run(config, workdir) -> result``.

The run directory holds everything needed to trust and compare the run::

    config.json      the config, plus what it resolved to ("resolved": shape,
                     tokenizer ids, parameter count, mesh)
    metrics.jsonl    one JSON object per logged step
    tb/              TensorBoard events (same scalars + per-block statistics)
    checkpoints/     Orbax checkpoints (state, data position, run clock)
    result.json      written atomically when the run ends (finished or diverged)

Re-running on the same directory resumes from the latest checkpoint and
continues exactly (same batches, same RNG, bitwise-equal losses on CPU); a
directory with a ``result.json`` is not retrained.  SIGTERM/SIGINT save a
checkpoint at the next step boundary and return ``status="preempted"``
(no ``result.json``).  A NaN/inf loss or gradient norm, or a loss above
``train.max_loss``, ends the run with ``diverged: true``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from depthbench import config as config_lib
from depthbench import costs, data, parallel
from depthbench.config import ConfigError
from depthbench.model.spec import ModelSpec
from depthbench.train import state as state_lib
from depthbench.train import step as step_lib
from depthbench.train import summary as summary_lib
from depthbench.train.checkpoint import Checkpoints
from depthbench.train.metrics import MetricsWriter

EXIT_OK = 0
EXIT_DIVERGED = 3

CONFIG_FILE = "config.json"
RESULT_FILE = "result.json"
CHECKPOINT_DIR = "checkpoints"

RUNTIME_FIELDS = config_lib.RUNTIME_FIELDS


# ------------------------------------------------------------------ files


def atomic_write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


def config_difference(saved: dict, config: dict) -> tuple[str, Any, Any] | None:
    """The first field (dotted) whose value differs between a run's saved
    config and ``config``, ignoring runtime fields and what the run resolved;
    None when they describe the same run."""
    changes = config_lib.config_changes(saved, config, ignore_prefixes=("resolved.",))
    return changes[0] if changes else None


def check_workdir(config, workdir: Path) -> dict | None:
    """Raise ConfigError if ``workdir`` holds a different run; return its
    ``result.json`` if the same run already ended there."""
    cfg_path = workdir / CONFIG_FILE
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"--workdir: {str(workdir)!r} exists and is not a directory")
    if not cfg_path.exists():
        if (workdir / RESULT_FILE).exists() or (workdir / CHECKPOINT_DIR).exists():
            raise ConfigError(f"--workdir: {str(workdir)!r} holds a run without {CONFIG_FILE}; "
                              "use an empty or new directory")
        return None
    try:
        saved = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--workdir: {cfg_path} is unreadable ({e}); use a new directory") from e
    diff = config_difference(saved, config.to_dict())
    if diff is not None:
        key, old, new = diff
        raise ConfigError(f"config.{key}: {str(workdir)!r} holds a run with {key}={old!r}, not "
                          f"{new!r}; use the same config to resume it or a new --workdir")
    result_path = workdir / RESULT_FILE
    if result_path.exists():
        return json.loads(result_path.read_text())
    return None


LOCK_FILE = ".train.lock"


@contextlib.contextmanager
def workdir_lock(workdir: Path, enabled: bool = True) -> Iterator[None]:
    """Refuse to train a run directory that another live process on this host
    is training (two writers would interleave checkpoints and metrics).

    A lock left by a dead process, or by another host (which this host cannot
    check, e.g. a preempted VM), is taken over.
    """
    if not enabled:
        yield
        return
    path, host, pid = workdir / LOCK_FILE, socket.gethostname(), os.getpid()
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError):
        held = None
    if held and held.get("host") == host and held.get("pid") != pid and _alive(held.get("pid")):
        raise ConfigError(f"--workdir: {str(workdir)!r} is being trained by process "
                          f"{held['pid']} on this host; wait for it or stop it first")
    workdir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"host": host, "pid": pid, "started": time.time()})
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text()).get("pid") == pid:
                path.unlink()


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------- signals


class Preemption:
    """SIGTERM/SIGINT set a flag the loop checks at each step boundary.

    A second SIGINT aborts at once (KeyboardInterrupt), as a user expects.
    Handlers are installed only from the main thread and restored on exit.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None

    def _handle(self, signum, frame):
        del frame
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum
        print(f"\nreceived {signal.Signals(signum).name}: saving a checkpoint at the next step "
              "boundary (press Ctrl-C again to abort without saving)", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Preemption]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


# ------------------------------------------------------------ compiled fns


_COMPILED: dict[str, tuple] = {}
_COMPILED_MAX = 2
# Fields the compiled functions do not depend on (read on the host only).
_HOST_ONLY = ("name", "data.", "eval.", "train.seed", "train.max_loss", "train.keep_checkpoints",
              "train.checkpoint_every", "train.log_every", "train.eval_every",
              "train.layer_stats_every")


def _compiled(config) -> tuple:
    """Setup and jitted functions (init, train, eval, layer stats) for
    ``config`` on its mesh, memoised: running the same model and recipe again
    in one process (a resume, a sweep retry, tests) compiles nothing new."""
    fields = {k: v for k, v in config_lib.flatten(config.to_dict()).items()
              if not any(k.startswith(h) for h in _HOST_ONLY)}
    key = json.dumps([fields, [d.id for d in jax.devices()]], sort_keys=True, default=str)
    if key not in _COMPILED:
        while len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        s = state_lib.setup(config, parallel.mesh_from_config(config))
        micro = int(config.train.microbatches)
        _COMPILED[key] = (s, state_lib.make_init(s), step_lib.make_train_step(s, micro),
                          step_lib.make_eval_step(s), step_lib.make_layer_stats(s))
    return _COMPILED[key]


# ------------------------------------------------------------------ the run


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


class _Clock:
    """Compute time of training steps, excluding each session's first step
    (compilation), so throughput is what the hardware sustains."""

    def __init__(self, seconds: float = 0.0, tokens: int = 0):
        self.seconds, self.tokens = seconds, tokens
        self.mark_seconds, self.mark_tokens = seconds, tokens

    def add(self, seconds: float, tokens: int) -> None:
        self.seconds += seconds
        self.tokens += tokens

    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    def interval_rate(self) -> float | None:
        """Tokens/s since the previous call."""
        ds, dt = self.seconds - self.mark_seconds, self.tokens - self.mark_tokens
        self.mark_seconds, self.mark_tokens = self.seconds, self.tokens
        return dt / ds if ds > 0 else None


def run(config, workdir: str | Path, *, progress: bool = True) -> dict:
    """Train ``config`` in ``workdir`` (resuming if it holds a checkpoint).

    Returns the ``result.json`` dict with ``status`` "finished" or "diverged",
    or ``{"status": "preempted", "step": N, "message": ...}`` after
    SIGTERM/SIGINT (no ``result.json`` is written then).  A run that already
    ended in ``workdir`` is returned as recorded, with ``already_done: True``.
    Bad input raises :class:`~depthbench.config.ConfigError`.
    """
    wall_start = time.time()
    if "://" in str(workdir):
        raise ConfigError(f"--workdir: {str(workdir)!r} is a URL; runs write to a filesystem "
                          "path (shared by all hosts: NFS, Lustre, a gcsfuse mount of a bucket)")
    workdir = Path(workdir).expanduser().resolve()
    parallel.maybe_initialize_distributed(config.parallel.distributed)
    done = check_workdir(config, workdir)
    if done is not None:
        return {**done, "already_done": True}
    preempt = Preemption()
    # Installed before start-up: a signal during data preparation or
    # compilation stops the run at its first step boundary.
    with workdir_lock(workdir, enabled=jax.process_index() == 0), preempt.installed():
        session = _Session(config, workdir, progress, wall_start)
        try:
            session.train(preempt)
        finally:
            session.close()
    return session.outcome()


class _Session:
    """One process's part of a run: start-up (data, compiled functions, state),
    the step loop, and the outcome."""

    def __init__(self, config, workdir: Path, progress: bool, wall_start: float):
        self.config, self.workdir, self.wall_start = config, workdir, wall_start
        self.main = jax.process_index() == 0
        t = config.train
        parallel.check_batch(parallel.mesh_from_config(config), int(t.batch_size),
                             int(t.microbatches))
        self.spec = spec = ModelSpec.from_config(config)
        prepared = data.prepare(config, progress=progress and self.main)
        if prepared.vocab_size > spec.vocab_size:
            raise ConfigError(f"config.model.vocab_size: {spec.vocab_size} is smaller than the "
                              f"tokenizer's {prepared.vocab_size} pieces")
        s, init_fn, self.train_fn, self.eval_fn, self.stats_fn = _compiled(config)
        self.mesh = s.mesh
        self.n_params = state_lib.param_count(s.abstract_state.params)
        self.flops_per_token = float(costs.train_flops_per_token(spec, int(t.seq_len)))
        self.device_kind = self.mesh.devices.flat[0].device_kind
        self.steps = int(t.steps)
        self.tokens_per_step = int(t.batch_size) * int(t.seq_len)
        if self.main:
            workdir.mkdir(parents=True, exist_ok=True)
            if not (workdir / CONFIG_FILE).exists():
                resolved = {"shape": spec.shape.as_dict(), "params": self.n_params,
                            "flops_per_token": self.flops_per_token,
                            "tokenizer": prepared.as_dict(), "mesh": parallel.describe(self.mesh)}
                atomic_write_json(workdir / CONFIG_FILE,
                                  {**config.to_dict(), "resolved": resolved})

        self.ckpt = Checkpoints(workdir / CHECKPOINT_DIR, int(t.keep_checkpoints))
        self.it = data.train_iterator(config, prepared)
        latest = self.ckpt.latest_step()
        if latest is None:
            self.state, meta = state_lib.init_state(s, int(t.seed), init_fn), {}
        else:
            self.state, meta = self.ckpt.restore(latest, s.abstract_state,
                                                 data.checkpoint_restore_arg(self.it))
        self.start = self.step = int(jax.device_get(self.state.step))
        self.val = [parallel.host_batch_to_global(b, self.mesh)
                    for b in data.val_batches(config, prepared)]
        self.writer = MetricsWriter(workdir, self.start, enabled=self.main)
        self.clock = _Clock(float(meta.get("train_seconds", 0.0)),
                            int(meta.get("timed_tokens", 0)))
        self.wall_before = float(meta.get("wall_seconds", 0.0))
        self.status, self.diverged_at, self.val_loss, self.last_loss = "finished", None, None, None
        self.bar = summary_lib.progress_bar(progress and self.main, self.start, self.steps, spec)
        if self.main and self.start:
            # Messages go to stderr with the bar: stdout is the summary (or --json).
            self.bar.write(f"resuming {workdir} from step {self.start}", file=sys.stderr)

    # ------------------------------------------------------------ pieces
    def evaluate(self) -> float:
        losses = [self.eval_fn(self.state.params, b) for b in self.val]
        return float(np.mean(jax.device_get(losses)))

    def wall_seconds(self) -> float:
        return self.wall_before + time.time() - self.wall_start

    def save(self) -> None:
        meta = {"train_seconds": self.clock.seconds, "timed_tokens": self.clock.tokens,
                "wall_seconds": self.wall_seconds()}
        self.ckpt.save(self.step, self.state, data.checkpoint_save_arg(self.it), meta)

    def mfu(self, rate: float | None) -> float | None:
        if rate is None:
            return None
        return costs.mfu(rate * self.flops_per_token, self.device_kind, self.mesh.size)

    def due(self, every: int) -> bool:
        """At every ``every`` steps and at the last step (``every`` <= 0: never)."""
        return every > 0 and (self.step % every == 0 or self.step == self.steps)

    # ------------------------------------------------------------ the loop
    def train(self, preempt: Preemption) -> None:
        t = self.config.train
        first = True
        while self.step < self.steps:
            if parallel.sync_flag(preempt.received is not None):
                if self.step > 0:
                    self.save()  # a no-op if this step is already checkpointed
                self.status = "preempted"
                return
            t0 = time.perf_counter()
            batch = parallel.host_batch_to_global(next(self.it), self.mesh)
            self.state, m = self.train_fn(self.state, batch)
            # Reading the loss every step syncs host and device; it is what
            # lets a divergence stop the run at the step where it happened.
            loss, grad_norm, lr = (float(x) for x in jax.device_get(
                (m["loss"], m["grad_norm"], m["lr"])))
            if not first:
                self.clock.add(time.perf_counter() - t0, self.tokens_per_step)
            first = False
            self.step += 1
            self.last_loss = loss
            self.bar.update(1)
            bad = not (_finite(loss) and _finite(grad_norm)) or loss > float(t.max_loss)
            eval_now = self.due(int(t.eval_every)) and not bad
            if bad or eval_now or self.step % int(t.log_every) == 0:
                rate = self.clock.interval_rate()
                row = {"loss": loss, "lr": lr, "grad_norm": grad_norm,
                       "tokens": self.step * self.tokens_per_step, "tokens_per_sec": rate,
                       "mfu": self.mfu(rate)}
                if eval_now:
                    self.val_loss = row["val_loss"] = self.evaluate()
                self.writer.log(self.step, row)
                self.bar.set_postfix_str(summary_lib.postfix(loss, self.val_loss,
                                                             self.clock.rate()), refresh=False)
            if bad:
                self.status, self.diverged_at = "diverged", self.step
                self.bar.write(f"diverged at step {self.step}: loss {loss:.4g}, grad norm "
                               f"{grad_norm:.4g} (train.max_loss {float(t.max_loss):g})",
                               file=sys.stderr)
                return
            if self.due(int(t.layer_stats_every)):
                stats = self.stats_fn(self.state.params, self.val[0]["inputs"])
                self.writer.layer_stats(self.step, jax.device_get(stats))
            if self.due(int(t.checkpoint_every)):
                self.save()
        if self.val_loss is None:
            # The last step was trained by an earlier session (killed between
            # its final checkpoint and result.json): evaluate the restored state.
            self.val_loss = self.evaluate()

    def close(self) -> None:
        self.bar.close()
        self.writer.close()
        self.ckpt.close()

    # ------------------------------------------------------------ outcome
    def outcome(self) -> dict:
        if self.status == "preempted":
            message = (f"preempted at step {self.step}; re-run the same command to resume "
                       f"(checkpoints in {self.workdir / CHECKPOINT_DIR})")
            return {"status": "preempted", "step": self.step, "steps": self.steps,
                    "message": message, "workdir": str(self.workdir)}
        spec, t = self.spec, self.config.train
        rate = self.clock.rate()
        result = {
            "family": spec.family, "depth": spec.depth, "d_model": spec.d_model,
            "d_ff": spec.d_ff, "n_heads": spec.n_heads,
            "aspect_ratio": round(spec.shape.aspect_ratio, 4), "params": self.n_params,
            "steps": self.step, "tokens": self.step * self.tokens_per_step,
            "final_val_loss": self.val_loss if self.status == "finished" else None,
            "final_train_loss": self.last_loss if _finite(self.last_loss) else None,
            "tokens_per_sec": rate, "mfu": self.mfu(rate),
            "diverged": self.status == "diverged", "diverged_at_step": self.diverged_at,
            "wall_seconds": round(self.wall_seconds(), 3), "status": self.status,
            "lr": float(t.lr), "batch_size": int(t.batch_size), "seq_len": int(t.seq_len),
            "flops_per_token": self.flops_per_token, "device_kind": self.device_kind,
            "n_devices": int(self.mesh.size), "name": str(self.config.name),
        }
        if self.main:
            atomic_write_json(self.workdir / RESULT_FILE, result)
        return result


summary = summary_lib.summary
