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
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from depthbench import costs, data, parallel
from depthbench.config import ConfigError
from depthbench.model.spec import ModelSpec
from depthbench.train import state as state_lib
from depthbench.train import step as step_lib
from depthbench.train.checkpoint import Checkpoints
from depthbench.train.metrics import MetricsWriter

EXIT_OK = 0
EXIT_DIVERGED = 3

CONFIG_FILE = "config.json"
RESULT_FILE = "result.json"
CHECKPOINT_DIR = "checkpoints"

# Fields that say how a run executes, not what it computes: they may change
# when a run is resumed (e.g. on a different mesh after a preemption).
RUNTIME_FIELDS = ("parallel.", "data.cache_dir", "data.prefetch", "data.worker_count",
                  "train.keep_checkpoints", "train.checkpoint_every", "train.log_every",
                  "train.eval_every", "train.layer_stats_every")


# ------------------------------------------------------------------ files


def atomic_write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_difference(saved: dict, config: dict) -> tuple[str, Any, Any] | None:
    """The first field (dotted) whose value differs between two config dicts,
    ignoring :data:`RUNTIME_FIELDS`; None when they describe the same run."""
    a, b = _flatten(saved), _flatten(config)
    for key in sorted(set(a) | set(b)):
        if key.startswith("resolved.") or any(key.startswith(f) for f in RUNTIME_FIELDS):
            continue
        va, vb = a.get(key), b.get(key)
        if isinstance(va, list):
            va = tuple(va)
        if isinstance(vb, list):
            vb = tuple(vb)
        if va != vb:
            return key, va, vb
    return None


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
_HOST_ONLY = ("name", "data.", "train.seed", "train.max_loss", "train.keep_checkpoints",
              "train.checkpoint_every", "train.log_every", "train.eval_every",
              "train.layer_stats_every")


def _compiled(config) -> tuple:
    """Setup and jitted functions (init, train, eval, layer stats) for
    ``config`` on its mesh, memoised: running the same model and recipe again
    in one process (a resume, a sweep retry, tests) compiles nothing new."""
    fields = {k: v for k, v in _flatten(config.to_dict()).items()
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


def _finite(x: float) -> bool:
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
    or ``{"status": "preempted", "step": N, ...}`` after SIGTERM/SIGINT (no
    ``result.json`` is written then).  A run that already ended in ``workdir``
    is returned as recorded, with ``already_done: True``.  Bad input raises
    :class:`~depthbench.config.ConfigError`.
    """
    wall_start = time.time()
    workdir = Path(workdir).expanduser().resolve()
    parallel.maybe_initialize_distributed(config.parallel.distributed)
    done = check_workdir(config, workdir)
    if done is not None:
        return {**done, "already_done": True}
    main = jax.process_index() == 0
    t = config.train

    mesh = parallel.mesh_from_config(config)
    parallel.check_batch(mesh, int(t.batch_size), int(t.microbatches))
    spec = ModelSpec.from_config(config)
    prepared = data.prepare(config, progress=progress and main)
    if prepared.vocab_size > spec.vocab_size:
        raise ConfigError(f"config.model.vocab_size: {spec.vocab_size} is smaller than the "
                          f"tokenizer's {prepared.vocab_size} pieces")
    s, init_fn, train_fn, eval_fn, stats_fn = _compiled(config)
    mesh = s.mesh
    n_params = state_lib.param_count(s.abstract_state.params)
    flops_per_token = float(costs.train_flops_per_token(spec, int(t.seq_len)))
    device_kind = mesh.devices.flat[0].device_kind
    shape = spec.shape

    if main:
        workdir.mkdir(parents=True, exist_ok=True)
        if not (workdir / CONFIG_FILE).exists():
            resolved = {"shape": shape.as_dict(), "params": n_params,
                        "flops_per_token": flops_per_token, "tokenizer": prepared.as_dict(),
                        "mesh": parallel.describe(mesh)}
            atomic_write_json(workdir / CONFIG_FILE, {**config.to_dict(), "resolved": resolved})

    ckpt = Checkpoints(workdir / CHECKPOINT_DIR, int(t.keep_checkpoints))
    it = data.train_iterator(config, prepared)
    latest = ckpt.latest_step()
    if latest is None:
        st, meta = state_lib.init_state(s, int(t.seed), init_fn), {}
    else:
        st, meta = ckpt.restore(latest, s.abstract_state, data.checkpoint_restore_arg(it))
    start = int(jax.device_get(st.step))
    val = [parallel.host_batch_to_global(b, mesh) for b in data.val_batches(config, prepared)]
    writer = MetricsWriter(workdir, start, enabled=main)
    if main and start:
        print(f"resuming {workdir} from step {start}", file=sys.stderr, flush=True)

    steps, tokens_per_step = int(t.steps), int(t.batch_size) * int(t.seq_len)
    clock = _Clock(float(meta.get("train_seconds", 0.0)), int(meta.get("timed_tokens", 0)))
    wall_before = float(meta.get("wall_seconds", 0.0))

    def evaluate(params) -> float:
        losses = [eval_fn(params, b) for b in val]
        return float(np.mean(jax.device_get(losses)))

    def save(step_now: int) -> None:
        meta_now = {"train_seconds": clock.seconds, "timed_tokens": clock.tokens,
                    "wall_seconds": wall_before + time.time() - wall_start}
        ckpt.save(step_now, st, data.checkpoint_save_arg(it), meta_now)

    def mfu_of(rate: float | None) -> float | None:
        if rate is None:
            return None
        return costs.mfu(rate * flops_per_token, device_kind, mesh.size)

    step, status, diverged_at, val_loss, last_loss = start, "finished", None, None, None
    bar = _progress_bar(progress and main, start, steps, spec)
    preempt = Preemption()
    try:
        with preempt.installed():
            first = True
            while step < steps:
                if parallel.sync_flag(preempt.received is not None):
                    if step > 0:
                        save(step)  # a no-op if this step is already checkpointed
                    status = "preempted"
                    break
                t0 = time.perf_counter()
                batch = parallel.host_batch_to_global(next(it), mesh)
                st, m = train_fn(st, batch)
                loss, grad_norm, lr = (float(x) for x in jax.device_get(
                    (m["loss"], m["grad_norm"], m["lr"])))
                if not first:
                    clock.add(time.perf_counter() - t0, tokens_per_step)
                first = False
                step += 1
                last_loss = loss
                bar.update(1)
                bad = not (_finite(loss) and _finite(grad_norm)) or loss > float(t.max_loss)
                eval_now = step % int(t.eval_every) == 0 or step == steps
                if bad or eval_now or step % int(t.log_every) == 0:
                    row = {"loss": loss, "lr": lr, "grad_norm": grad_norm,
                           "tokens": step * tokens_per_step}
                    rate = clock.interval_rate()
                    row.update(tokens_per_sec=rate, mfu=mfu_of(rate))
                    if eval_now and not bad:
                        val_loss = evaluate(st.params)
                        row["val_loss"] = val_loss
                    writer.log(step, row)
                    bar.set_postfix_str(_postfix(loss, val_loss, clock.rate()), refresh=False)
                if bad:
                    status, diverged_at = "diverged", step
                    bar.write(f"diverged at step {step}: loss {loss:.4g}, grad norm "
                              f"{grad_norm:.4g} (max_loss {float(t.max_loss):g})")
                    break
                every = int(t.layer_stats_every)
                if every > 0 and (step % every == 0 or step == steps):
                    stats = stats_fn(st.params, val[0]["inputs"])
                    writer.layer_stats(step, jax.device_get(stats))
                if step % int(t.checkpoint_every) == 0 or step == steps:
                    save(step)
        if status == "finished" and val_loss is None:
            # The last step was trained by an earlier session (killed between
            # its final checkpoint and result.json): evaluate the restored state.
            val_loss = evaluate(st.params)
    finally:
        bar.close()
        writer.close()
        ckpt.close()

    if status == "preempted":
        message = (f"preempted at step {step}; re-run the same command to resume "
                   f"(checkpoint in {workdir / CHECKPOINT_DIR})")
        return {"status": "preempted", "step": step, "steps": steps, "message": message,
                "workdir": str(workdir)}

    result = {
        "family": spec.family, "depth": spec.depth, "d_model": spec.d_model, "d_ff": spec.d_ff,
        "n_heads": spec.n_heads, "aspect_ratio": round(shape.aspect_ratio, 4),
        "params": n_params, "steps": step, "tokens": step * tokens_per_step,
        "final_val_loss": val_loss if status == "finished" else None,
        "final_train_loss": last_loss if _finite(last_loss) else None,
        "tokens_per_sec": clock.rate(), "mfu": mfu_of(clock.rate()),
        "diverged": status == "diverged", "diverged_at_step": diverged_at,
        "wall_seconds": round(wall_before + time.time() - wall_start, 3),
        "status": status, "lr": float(t.lr), "batch_size": int(t.batch_size),
        "seq_len": int(t.seq_len), "flops_per_token": flops_per_token,
        "device_kind": device_kind, "n_devices": int(mesh.size), "name": str(config.name),
    }
    if main:
        atomic_write_json(workdir / RESULT_FILE, result)
    return result


# ---------------------------------------------------------------- display


class _NoBar:
    def update(self, n=1):
        pass

    def set_postfix_str(self, s, refresh=True):
        pass

    def write(self, s):
        print(s, file=sys.stderr, flush=True)

    def close(self):
        pass


def _progress_bar(enabled: bool, start: int, steps: int, spec: ModelSpec):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=steps, initial=start, unit="step", dynamic_ncols=True,
                desc=f"{spec.family} L{spec.depth} d{spec.d_model}", file=sys.stderr)


def _postfix(loss: float, val_loss: float | None, rate: float | None) -> str:
    parts = [f"loss {loss:.4f}"]
    if val_loss is not None:
        parts.append(f"val {val_loss:.4f}")
    if rate is not None:
        parts.append(f"{rate:,.0f} tok/s")
    return "  ".join(parts)


def _count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


def summary(result: dict, workdir: str | Path) -> str:
    """The one-screen end-of-run summary (an aligned two-column table)."""
    r = result
    if r.get("status") == "preempted":
        return r["message"]
    val = r.get("final_val_loss")
    rows = [
        ("run", str(workdir)),
        ("status", r.get("status", "?") + (" (already done; not retrained)"
                                           if r.get("already_done") else "")),
        ("model", f"{r['family']}  L {r['depth']}  d_model {r['d_model']}  d_ff {r.get('d_ff')}  "
                  f"heads {r.get('n_heads')}  aspect {r.get('aspect_ratio')}"),
        ("parameters", _count(r["params"])),
        ("steps", f"{r['steps']}  ({_count(r['tokens'])} tokens)"),
        ("final val loss", "-" if val is None else f"{val:.4f}"),
        ("final train loss", "-" if r.get("final_train_loss") is None
         else f"{r['final_train_loss']:.4f}"),
        ("throughput", "-" if r.get("tokens_per_sec") is None
         else f"{r['tokens_per_sec']:,.0f} tokens/s on {r.get('n_devices')} x "
              f"{r.get('device_kind')}"),
        ("MFU", "n/a (unknown device peak)" if r.get("mfu") is None
         else f"{100 * r['mfu']:.1f}%"),
        ("wall time", _duration(r["wall_seconds"])),
        ("diverged", f"yes, at step {r['diverged_at_step']}" if r.get("diverged") else "no"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append(f"{'files':<{width}}  {RESULT_FILE}, metrics.jsonl, tb/ "
                 f"(tensorboard --logdir {Path(workdir) / 'tb'})")
    return "\n".join(lines)
