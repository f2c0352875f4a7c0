"""The run: directory contents, exact resume, preemption, divergence, bad input.

A tiny model trains on a pre-tokenised shard of learnable sequences
(arithmetic progressions), so these tests need neither the network nor a
tokenizer.  Runs of one config share compiled functions
(``train.compiled``), so each extra run costs only its steps.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fast_xla import subprocess_flags
from toy_corpus import tiny_run_overrides

from depthbench import config as config_lib
from depthbench import data
from depthbench.cli import main as cli_main
from depthbench.config import ConfigError
from depthbench.errors import EXIT_DIVERGED
from depthbench.rundir.io import read_jsonl
from depthbench.rundir.names import LOCK_FILE
from depthbench.train import loop
from depthbench.train import state as state_lib

VOCAB = 64
STEPS = 128  # long enough for a SIGTERM to land mid-run under the suite's load (~1 s)
EVERY = 16  # eval, checkpoint and layer-stats interval
BATCH, SEQ = 4, 16


@pytest.fixture(scope="module")
def overrides(tmp_path_factory):
    return tiny_run_overrides(tmp_path_factory.mktemp("corpus"), STEPS, EVERY, n_docs=600,
                              vocab_size=VOCAB, val_windows=8, batch_size=BATCH, seq_len=SEQ)


def _config(overrides, *extra):
    return config_lib.load(config_lib.base_spec_path(), [*overrides, *extra])


@pytest.fixture(scope="module")
def finished(overrides, tmp_path_factory, sigterm_job):
    """The reference run (uninterrupted), trained while the SIGTERM job's
    subprocess starts up and compiles (on the other core)."""
    workdir = tmp_path_factory.mktemp("runs") / "a"
    result = loop.run(_config(overrides), workdir, progress=False)
    return workdir, result


def _losses(workdir):
    return [(r["step"], r["loss"]) for r in read_jsonl(Path(workdir) / "metrics.jsonl")]


def _tb_tags(workdir) -> set[tuple[str, int]]:
    from tensorboardX.proto import event_pb2

    tags = set()
    for f in glob.glob(str(Path(workdir) / "tb" / "events.*")):
        raw, i = Path(f).read_bytes(), 0
        while i < len(raw):
            (n,) = struct.unpack("<Q", raw[i:i + 8])
            event = event_pb2.Event()
            event.ParseFromString(raw[i + 12:i + 12 + n])
            i += 12 + n + 4
            tags.update((v.tag, event.step) for v in event.summary.value)
    return tags


# ----------------------------------------------------------- a finished run


def test_run_directory_holds_everything(finished):
    workdir, r = finished
    assert r["status"] == "finished" and r["diverged"] is False and r["diverged_at_step"] is None
    assert (r["family"], r["depth"], r["d_model"]) == ("pre_ln", 2, 32)
    assert r["steps"] == STEPS and r["tokens"] == STEPS * BATCH * SEQ
    assert r["params"] == 2 * (4 * 32 * 32 + 3 * 32 * 64 + 2 * 32) + 2 * VOCAB * 32 + 32
    assert np.isfinite(r["final_val_loss"]) and r["final_val_loss"] < np.log(VOCAB)
    assert r["mfu"] is None  # CPU: no known peak, never a made-up number
    assert r["tokens_per_sec"] > 0 and r["wall_seconds"] > 0
    assert json.loads((workdir / "result.json").read_text()) == r

    rows = read_jsonl(workdir / "metrics.jsonl")
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    for row in rows:
        assert {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_sec", "mfu"} <= set(row)
        assert row["tokens"] == row["step"] * BATCH * SEQ
    assert [row["step"] for row in rows if "val_loss" in row] == list(range(EVERY, STEPS + 1,
                                                                             EVERY))
    assert rows[-1]["val_loss"] == r["final_val_loss"]
    assert rows[0]["loss"] == pytest.approx(np.log(VOCAB), abs=0.1)

    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"]["family"] == "pre_ln" and saved["train"]["steps"] == STEPS
    assert saved["resolved"]["shape"]["d_model"] == 32
    assert saved["resolved"]["tokenizer"]["eos_id"] == 0
    assert saved["resolved"]["params"] == r["params"]
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                  if p.name.isdigit()) == [STEPS - EVERY, STEPS]  # keep_checkpoints = 2

    tags = _tb_tags(workdir)
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_sec"):
        assert (tag, STEPS) in tags
    assert ("eval/val_loss", EVERY) in tags and ("eval/val_loss", STEPS) in tags
    for i in range(3):  # z_0 .. z_L
        assert (f"layers/state_rms/{i:03d}", EVERY) in tags
    assert ("layers/update_rms/001", STEPS) in tags
    for stat in ("forward", "backward"):  # the original's four, per block
        for moment in ("mean", "variance", "magnitude", "norm"):
            assert (f"layers/{stat}_{moment}/001", STEPS) in tags


def test_finished_run_is_not_retrained(finished, overrides, capsys):
    workdir, r = finished
    before = (workdir / "metrics.jsonl").read_text()
    code = cli_main(["train", "--config", str(config_lib.base_spec_path()), "--workdir",
                     str(workdir), "--no-progress", *(f"--config.{o}" for o in overrides)])
    out = capsys.readouterr().out
    assert code == 0
    assert "already holds a finished run; not retraining" in out
    assert "final val loss" in out and f"{r['final_val_loss']:.4f}" in out
    assert (workdir / "metrics.jsonl").read_text() == before


def test_a_different_config_is_bad_input(finished, overrides):
    workdir, _ = finished
    with pytest.raises(ConfigError, match=r"^config\.train\.lr: .*lr=0\.01, not 0\.02"):
        loop.run(_config(overrides, "train.lr=2e-2"), workdir, progress=False)
    # Runtime fields (how, not what) may change on resume.
    assert loop.run(_config(overrides, "train.log_every=2"), workdir,
                    progress=False)["already_done"]


def test_a_run_being_trained_elsewhere_is_refused(finished, overrides, tmp_path):
    workdir = tmp_path / "locked"
    workdir.mkdir()
    (workdir / LOCK_FILE).write_text(json.dumps(
        {"host": socket.gethostname(), "pid": os.getppid()}))  # a live process, not this one
    with pytest.raises(ConfigError, match=r"^--workdir: .* is being trained by process"):
        loop.run(_config(overrides), workdir, progress=False)
    assert not (workdir / "config.json").exists()


# ------------------------------------------------------------------ resume


class _Killed(Exception):
    pass


class _DyingIterator:
    """Wraps the grain iterator; dies (like kill -9) when asked for batch ``n``."""

    def __init__(self, it, n):
        self.it, self.n, self.served = it, n, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.served == self.n:
            raise _Killed
        self.served += 1
        return next(self.it)

    # grain's checkpoint handler stores a non-grain iterator's state as text bytes.
    def get_state(self) -> bytes:
        return json.dumps(self.it.get_state(), indent=4).encode()

    def set_state(self, state: bytes) -> None:
        self.it.set_state(json.loads(state))

    def start_prefetch(self) -> None:
        self.it.start_prefetch()


def test_kill_then_resume_is_exact(finished, overrides, tmp_path, monkeypatch):
    reference, ref_result = finished
    workdir = tmp_path / "b"
    real = data.train_iterator
    monkeypatch.setattr(data, "train_iterator",
                        lambda *a, **k: _DyingIterator(real(*a, **k), STEPS - 2))
    with pytest.raises(_Killed):
        loop.run(_config(overrides), workdir, progress=False)
    # Killed after step 62: steps 49-62 were logged but not checkpointed (last: step 48).
    assert [s for s, _ in _losses(workdir)] == list(range(1, STEPS - 1))
    assert max(int(p.name) for p in (workdir / "checkpoints").iterdir()
               if p.name.isdigit()) == STEPS - EVERY
    assert not (workdir / "result.json").exists()
    monkeypatch.setattr(data, "train_iterator", real)

    result = loop.run(_config(overrides), workdir, progress=False)
    # The re-run restarts from step 48; metrics.jsonl reads as one uninterrupted run.
    assert _losses(workdir) == _losses(reference)  # bitwise equal losses
    assert [(r["step"], r.get("val_loss")) for r in read_jsonl(workdir / "metrics.jsonl")] == [
        (r["step"], r.get("val_loss")) for r in read_jsonl(reference / "metrics.jsonl")]
    assert result["final_val_loss"] == ref_result["final_val_loss"]
    assert result["final_train_loss"] == ref_result["final_train_loss"]
    tags = _tb_tags(workdir)
    assert ("train/loss", STEPS) in tags


class _SignallingIterator(_DyingIterator):
    """Sends ``signum`` to this process while batch ``n`` is being fetched."""

    def __init__(self, it, n, signum):
        super().__init__(it, -1)
        self.at, self.signum = n, signum

    def __next__(self):
        if self.served + 1 == self.at:
            os.kill(os.getpid(), self.signum)
        return super().__next__()


def test_sigint_right_after_a_periodic_checkpoint(finished, overrides, tmp_path, monkeypatch):
    """Ctrl-C during step 16 (a checkpoint step): the run saves step 16 once,
    returns "preempted", and the re-run matches the uninterrupted run."""
    reference, _ = finished
    workdir = tmp_path / "int"
    real = data.train_iterator
    monkeypatch.setattr(data, "train_iterator", lambda *a, **k: _SignallingIterator(
        real(*a, **k), EVERY, signal.SIGINT))
    # The handler the process had: Python's default, or SIG_IGN where a
    # non-interactive shell started pytest in the background.
    before = signal.getsignal(signal.SIGINT)
    r = loop.run(_config(overrides), workdir, progress=False)
    assert r["status"] == "preempted" and r["step"] == EVERY
    assert r["message"].startswith(f"preempted at step {EVERY}; re-run the same command")
    assert signal.getsignal(signal.SIGINT) is before  # restored
    assert not (workdir / "result.json").exists()
    monkeypatch.setattr(data, "train_iterator", real)
    assert loop.run(_config(overrides), workdir, progress=False)["status"] == "finished"
    assert _losses(workdir) == _losses(reference)


# -------------------------------------------------------------- divergence


def test_nan_diverges_with_exit_status_3(overrides, tmp_path, monkeypatch, capsys):
    """NaN weights (forced into the initial state) make the first loss NaN."""
    workdir = tmp_path / "nan"
    real_init = state_lib.init_state

    def poisoned(*a, **k):
        st = real_init(*a, **k)
        return st.replace(params={**st.params, "head": st.params["head"] * np.float32("nan")})

    monkeypatch.setattr(state_lib, "init_state", poisoned)
    args = ["train", "--config", str(config_lib.base_spec_path()), "--workdir", str(workdir),
            "--no-progress", *(f"--config.{o}" for o in overrides)]
    assert cli_main(args) == EXIT_DIVERGED == 3
    r = json.loads((workdir / "result.json").read_text())
    assert r["diverged"] is True and r["diverged_at_step"] == 1 and r["status"] == "diverged"
    assert r["final_val_loss"] is None and r["steps"] == 1
    last = read_jsonl(workdir / "metrics.jsonl")[-1]
    assert last["step"] == 1 and last["loss"] is None  # NaN is null in JSON
    assert not (workdir / "checkpoints" / "1").exists()  # a diverged state is not saved
    # A diverged run is recorded, not retrained: the same command reports it again
    # (with --json, stdout is exactly the recorded result).
    capsys.readouterr()
    assert cli_main([*args, "--json"]) == 3
    assert json.loads(capsys.readouterr().out) == {**r, "already_done": True}


def test_loss_above_the_bound_diverges(finished, overrides, tmp_path):
    workdir = tmp_path / "bound"
    r = loop.run(_config(overrides, "train.max_loss=4.0"), workdir, progress=False)
    # The first loss is ~ln(64) = 4.16 > 4.0.
    assert r["diverged"] is True and r["diverged_at_step"] == 1
    assert json.loads((workdir / "result.json").read_text())["diverged"] is True


# -------------------------------------------------------------- preemption


class _SigtermJob:
    """``depthbench train`` in a real process, sent SIGTERM once it has logged
    its first step (by a watcher thread, so the test session goes on)."""

    def __init__(self, overrides, workdir: Path):
        # Only the preemption may save: periodic checkpoints are pushed out of
        # the run (checkpoint_every is a runtime field, free to change on resume).
        extra = ["train.checkpoint_every=100000", "train.eval_every=100000",
                 "train.layer_stats_every=0"]
        self.workdir = workdir
        cmd = [sys.executable, "-m", "depthbench", "train", "--config",
               str(config_lib.base_spec_path()), "--workdir", str(workdir), "--no-progress",
               *(f"--config.{o}" for o in [*overrides, *extra])]
        # One device, as in this process, and its compile flags.
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": subprocess_flags()}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.signalled = False
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        metrics = self.workdir / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while self.proc.poll() is None and time.monotonic() < deadline:
            if metrics.exists() and metrics.read_text().strip():
                self.proc.send_signal(signal.SIGTERM)
                self.signalled = True
                return
            time.sleep(0.01)

    def result(self) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        self.watcher.join()
        return self.proc.returncode, out, err


@pytest.fixture(scope="module")
def sigterm_job(request, overrides, tmp_path_factory):
    wanted = any(item.name == "test_sigterm_saves_a_resumable_checkpoint"
                 for item in request.session.items)
    if not wanted:
        yield None
        return
    job = _SigtermJob(overrides, tmp_path_factory.mktemp("sigterm") / "pre")
    yield job
    if job.proc.poll() is None:
        job.proc.kill()


def test_sigterm_saves_a_resumable_checkpoint(sigterm_job, finished, overrides):
    """A real process gets SIGTERM mid-run: it saves, says how to resume and
    exits 0; re-running continues exactly (same losses as the uninterrupted run)."""
    code, out, err = sigterm_job.result()
    workdir = sigterm_job.workdir
    assert sigterm_job.signalled, f"never signalled: {err[-3000:]}"
    assert code == 0, err[-3000:]
    logged = [s for s, _ in _losses(workdir)]
    step = logged[-1]
    assert 0 < step < STEPS, "SIGTERM arrived too late to test anything"
    assert f"preempted at step {step}; re-run the same command to resume" in out
    assert "received SIGTERM" in err
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                  if p.name.isdigit()) == [step]
    assert not (workdir / "result.json").exists()

    resumed = loop.run(_config(overrides), workdir, progress=False)
    assert resumed["status"] == "finished" and resumed["steps"] == STEPS
    reference, ref_result = finished
    assert _losses(workdir) == _losses(reference)
    assert resumed["final_val_loss"] == ref_result["final_val_loss"]
