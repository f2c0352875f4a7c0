"""One training run, start to finish: ``run(config, workdir) -> result``.

Resuming, logging, evaluating, checkpointing, stopping at a signal or on
divergence (what a re-run does: docs/RUNS.md).  What a run trains on is its
:mod:`~depthbench.train.inputs`."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import jax

from depthbench import costs, data, faults, parallel
from depthbench import run_identity as identity
from depthbench.errors import ConfigError
from depthbench.model.spec import ModelSpec
from depthbench.rundir import io, lock
from depthbench.rundir.names import CHECKPOINT_DIR, CONFIG_FILE, METRICS_FILE, RESULT_FILE
from depthbench.train import preflight, record, wandb_sink
from depthbench.train import state as state_lib
from depthbench.train import summary as summary_lib
from depthbench.train.checkpoint import Checkpoints, resume_hint
from depthbench.train.compiled import compiled
from depthbench.train.inputs import CorpusInputs, Inputs
from depthbench.train.metrics import MetricsWriter
from depthbench.train.preemption import Preemption


def run(config, workdir: str | Path, *, progress: bool = True,
        inputs: Inputs | None = None) -> dict:
    """Train ``config`` in ``workdir`` (resuming if it holds a checkpoint) on
    ``inputs`` (default: the config's corpus from a fresh init).  Returns the
    ``result.json`` dict (``status`` "finished" or "diverged"), or ``{"status":
    "preempted", "step": N, "message": ...}`` after SIGTERM/SIGINT (no
    ``result.json``); a run that already ended is returned as recorded, with
    ``already_done: True``.  Bad input raises :class:`~depthbench.config.ConfigError`."""
    wall_start = time.time()
    # Before anything is written; a dry run checks the same (train/preflight.py).
    workdir = preflight.check_run(config, workdir)
    if inputs is None and config.get("finetune") and config.finetune.get("parent"):
        raise ConfigError("config.finetune.parent: a fine-tuning run is started by "
                          "`depthbench finetune PARENT_RUN --records FILE`, not by train")
    parallel.maybe_initialize_distributed(config.parallel.distributed)
    done = identity.check_run_dir(config, workdir)
    if done is not None:
        return {**done, "already_done": True}
    preempt = Preemption()
    try:
        # Installed before start-up: a signal during data preparation or
        # compilation stops the run at its first step boundary.
        with lock.training_claim(workdir, enabled=jax.process_index() == 0), \
                preempt.installed():
            session = _Session(config, workdir, progress, wall_start,
                               inputs or CorpusInputs(config))
            try:
                session.train(preempt)
            finally:
                session.close()
        return session.outcome()
    except OSError as e:
        if not faults.is_storage_error(e):
            raise
        # Said once every write has ended (close() waited for saves in flight),
        # so that the line is true about which checkpoint survived.
        raise faults.storage_error(e, None, resume_hint(workdir / CHECKPOINT_DIR)) from e


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _logged_at_start(workdir: Path) -> bool:
    """Whether metrics.jsonl holds step 0's validation loss (a session that
    stopped before its first checkpoint logged it already)."""
    return any(r.get("step") == 0 and "val_loss" in r
               for r in io.read_jsonl(workdir / METRICS_FILE))


def _restored_loss(meta: dict, workdir: Path, step: int) -> float | None:
    """The training loss of the step a checkpoint was taken at: recorded in its
    metadata, or (checkpoints written before it was) metrics.jsonl's row of that step."""
    if meta.get("last_loss") is not None:
        return float(meta["last_loss"])
    rows = [r for r in io.read_jsonl(workdir / METRICS_FILE) if r.get("step") == step]
    return rows[-1].get("loss") if rows and step > 0 else None


class _Session:
    """One process's part of a run: start-up (data, compiled functions, state),
    the step loop, and the outcome."""

    def __init__(self, config, workdir: Path, progress: bool, wall_start: float,
                 inputs: Inputs):
        self.config, self.workdir, self.wall_start = config, workdir, wall_start
        self.inputs = inputs
        self.main = jax.process_index() == 0
        t = config.train
        parallel.check_batch(parallel.mesh_from_config(config), int(t.batch_size),
                             int(t.microbatches))
        self.spec = spec = ModelSpec.from_config(config)
        inputs.prepare(progress and self.main)
        if inputs.vocab_size > spec.vocab_size:
            raise ConfigError(f"config.model.vocab_size: {spec.vocab_size} is smaller than the "
                              f"tokenizer's {inputs.vocab_size} pieces")
        s, init_fn, self.train_fn, self.eval_fn, self.stats_fn = compiled(config)
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
                            "flops_per_token": self.flops_per_token, **inputs.resolved(),
                            "mesh": parallel.describe(self.mesh)}
                for name, source in inputs.files().items():
                    shutil.copyfile(source, workdir / name)
                io.atomic_write_json(workdir / CONFIG_FILE,
                                     {**config.to_dict(), "resolved": resolved})

        self.ckpt = Checkpoints(workdir / CHECKPOINT_DIR, int(t.keep_checkpoints),
                                main_process=self.main)
        self.it = inputs.train_iterator()
        restored = self.ckpt.restore_latest(s.abstract_state, data.checkpoint_restore_arg(self.it),
                                            warn=_warn)
        if restored is None:
            self.state, meta = inputs.initial_state(s, int(t.seed), init_fn), {}
        else:
            self.state, meta = restored
        self.start = self.step = int(jax.device_get(self.state.step))
        self.val = [parallel.host_batch_to_global(b, self.mesh)
                    for b in inputs.val_batches()]
        self.writer = MetricsWriter(workdir, self.start, enabled=self.main, warn=_warn,
                                    wandb=wandb_sink.mode_of(config))
        self.clock = record.Clock(float(meta.get("train_seconds", 0.0)),
                            int(meta.get("timed_tokens", 0)))
        self.wall_before = float(meta.get("wall_seconds", 0.0))
        self.status, self.diverged_at, self.val_loss = "finished", None, None
        self.t_read = None  # when the last step's metrics were read (the clock's tick)
        # A run resumed at its last step (result.json deleted to evaluate again)
        # trains nothing: its final train loss is the checkpoint's.
        self.last_loss = _restored_loss(meta, workdir, self.start)
        self.bar = summary_lib.progress_bar(progress and self.main, self.start, self.steps, spec)
        if self.main and self.start:
            # Messages go to stderr with the bar: stdout is the summary (or --json).
            self.bar.write(f"resuming {workdir} from step {self.start}", file=sys.stderr)
        if inputs.evaluate_first and self.start == 0 and not _logged_at_start(workdir):
            self.writer.log(0, {"val_loss": self.evaluate()})  # where fine-tuning starts from

    def evaluate(self) -> float:
        losses = [self.eval_fn(self.state.params, b) for b in self.val]
        return self.inputs.val_loss(jax.device_get(losses))

    def wall_seconds(self) -> float:
        return self.wall_before + time.time() - self.wall_start

    def save(self) -> None:
        meta = {"train_seconds": self.clock.seconds, "timed_tokens": self.clock.tokens,
                "wall_seconds": self.wall_seconds(), "last_loss": self.last_loss}
        self.ckpt.save(self.step, self.state, data.checkpoint_save_arg(self.it), meta)

    def mfu(self, rate: float | None) -> float | None:
        if rate is None:
            return None
        return costs.mfu(rate * self.flops_per_token, self.device_kind, self.mesh.size)

    def due(self, every: int, step: int | None = None) -> bool:
        """At every ``every`` steps and at the last step (``every`` <= 0: never)."""
        step = self.step if step is None else step
        return every > 0 and (step % every == 0 or step == self.steps)

    def train(self, preempt: Preemption) -> None:
        """The step loop.  Step n + 1 is dispatched before step n's metrics are
        read (nanodo's habit): the host fetches and places the next batch while
        the device computes, and waits only for metrics that are already due.
        A step that must see its own state (evaluation, layer statistics, a
        checkpoint, the last step) is read at once.  Divergence still ends the
        run at the step where it happened: the one step dispatched after it is
        dropped with the state (a diverged run saves nothing)."""
        pending = None  # (step, metrics) dispatched, not yet read
        while self.step < self.steps:
            if parallel.sync_flag(preempt.received is not None):
                if pending is not None and not self._read(*pending):
                    return
                if self.step > 0:
                    self.save()  # a no-op if this step is already checkpointed
                self.status = "preempted"
                return
            try:
                batch = parallel.host_batch_to_global(next(self.it), self.mesh)
            except BaseException:
                if pending is not None:  # the data failed: still log the step trained
                    self._read(*pending)
                raise
            self.state, metrics = self.train_fn(self.state, batch)
            self.step += 1
            if pending is not None and not self._read(*pending):
                return
            pending = (self.step, metrics)
            if self._needs_state(self.step):
                pending = None
                if not self._read(self.step, metrics):
                    return
                self._with_state()
        if self.val_loss is None:
            # The last step was trained by an earlier session (killed between
            # its final checkpoint and result.json): evaluate the restored state.
            self.val_loss = self.evaluate()

    def _needs_state(self, step: int) -> bool:
        t = self.config.train
        return step == self.steps or any(
            self.due(int(every), step)
            for every in (t.eval_every, t.layer_stats_every, t.checkpoint_every))

    def _read(self, step: int, metrics: dict) -> bool:
        """Read one step's metrics: progress, clock, log row, divergence.
        False when the run diverged at ``step`` (status and step say so)."""
        t = self.config.train
        # Reading the loss syncs host and device; it is what lets a divergence
        # stop the run at the step where it happened.
        loss, grad_norm, lr = (float(x) for x in jax.device_get(
            (metrics["loss"], metrics["grad_norm"], metrics["lr"])))
        now = time.perf_counter()
        if self.t_read is not None:  # the session's first step includes compilation
            self.clock.add(now - self.t_read, self.tokens_per_step)
        self.t_read = now
        self.last_loss = loss
        self.bar.update(1)
        bad = not (io.finite(loss) and io.finite(grad_norm)) or loss > float(t.max_loss)
        eval_now = self.due(int(t.eval_every), step) and not bad
        if bad or eval_now or step % int(t.log_every) == 0:
            rate = self.clock.interval_rate()
            row = {"loss": loss, "lr": lr, "grad_norm": grad_norm,
                   "tokens": step * self.tokens_per_step, "tokens_per_sec": rate,
                   "mfu": self.mfu(rate)}
            if eval_now:
                self.val_loss = row["val_loss"] = self.evaluate()
            self.writer.log(step, row)
            self.bar.set_postfix_str(summary_lib.postfix(loss, self.val_loss,
                                                         self.clock.rate()), refresh=False)
        if bad:
            self.step = step
            self.status, self.diverged_at = "diverged", step
            self.bar.write(f"diverged at step {step}: loss {loss:.4g}, grad norm "
                           f"{grad_norm:.4g} (train.max_loss {float(t.max_loss):g})",
                           file=sys.stderr)
            return False
        return True

    def _with_state(self) -> None:
        """The work that needs the state of the step just read (``self.step``)."""
        t = self.config.train
        if self.due(int(t.layer_stats_every)):
            stats = self.stats_fn(self.state.params, self.val[0])
            self.writer.layer_stats(self.step, jax.device_get(stats))
        if self.due(int(t.checkpoint_every)):
            self.save()
        self.t_read = time.perf_counter()  # evaluation and saving are not step time

    def close(self) -> None:
        self.bar.close()
        self.writer.close()
        self.ckpt.close()

    def outcome(self) -> dict:
        if self.status == "preempted":
            return record.preempted(self.step, self.steps, self.workdir)
        rate = self.clock.rate()
        result = record.result(
            spec=self.spec, config=self.config, status=self.status, step=self.step,
            tokens_per_step=self.tokens_per_step, n_params=self.n_params,
            val_loss=self.val_loss, last_loss=self.last_loss, diverged_at=self.diverged_at,
            rate=rate, mfu=self.mfu(rate), wall_seconds=self.wall_seconds(),
            flops_per_token=self.flops_per_token, device_kind=self.device_kind,
            n_devices=int(self.mesh.size))
        result.update(self.inputs.result_fields(self.workdir))
        if self.main:
            io.atomic_write_json(self.workdir / RESULT_FILE, result)
        return result

