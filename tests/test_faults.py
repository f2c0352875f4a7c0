"""Faults: damaged checkpoints, signals and kills during writes, a killed
sweep, a full disk.  After each, the run resumes to the losses of an
uninterrupted run, bitwise, or stops with one clear line and leaves what was
already on disk intact.

A tiny model trains on a pre-tokenised shard of arithmetic progressions (no
tokenizer, no network).  In-process runs of one config share compiled
functions; faults that need a real process (kill -9, signals, resource
limits) run ``depthbench`` in a subprocess.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fast_xla import subprocess_flags
from toy_corpus import write_progressions

from depthbench import config as config_lib
from depthbench.cli import main as cli_main
from depthbench.digest import file_sha256 as file_digest
from depthbench.rundir.integrity import check_integrity
from depthbench.rundir.io import read_jsonl
from depthbench.rundir.restore import steps_on_disk
from depthbench.train import loop

STEPS, EVERY = 32, 8
BASE = str(config_lib.base_spec_path())


@pytest.fixture(scope="module")
def overrides(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_progressions(root / "shard.npy", 300)
    return [
        "model.suite=", "model.d_model=32", "model.d_ff=64", "model.depth=2", "model.n_heads=2",
        "model.vocab_size=64", "model.remat_policy=none",
        "data.corpus=tokens", f"data.paths={root / 'shard.npy'}", "data.eos_id=0",
        "data.val_fraction=0.1", "data.val_windows=4", f"data.cache_dir={root / 'cache'}",
        f"train.steps={STEPS}", "train.batch_size=4", "train.seq_len=16", "train.lr=1e-2",
        "train.log_every=1", f"train.eval_every={EVERY}", f"train.checkpoint_every={EVERY}",
        "train.layer_stats_every=0",
    ]


def _config(overrides, *extra):
    return config_lib.load(BASE, [*overrides, *extra])


def _argv(overrides, workdir, *extra):
    return ["train", "--config", BASE, "--workdir", str(workdir), "--no-progress",
            *(f"--config.{o}" for o in [*overrides, *extra])]


@pytest.fixture(scope="module")
def reference(overrides, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ref") / "run"
    result = loop.run(_config(overrides), workdir, progress=False)
    assert result["status"] == "finished"
    return workdir, result


def _losses(workdir):
    return [(r["step"], r["loss"], r.get("val_loss"))
            for r in read_jsonl(Path(workdir) / "metrics.jsonl")]


def _steps(workdir) -> list[int]:
    return steps_on_disk(Path(workdir) / "checkpoints")


def _assert_same_as(reference, workdir, result):
    ref_dir, ref_result = reference
    assert _losses(workdir) == _losses(ref_dir)  # bitwise: floats compared with ==
    assert result["final_val_loss"] == ref_result["final_val_loss"]
    assert result["steps"] == STEPS


def _interrupted_copy(reference, tmp_path) -> Path:
    """A run killed after its last checkpoint but before result.json."""
    workdir = tmp_path / "run"
    shutil.copytree(reference[0], workdir)
    (workdir / "result.json").unlink()
    return workdir


def _largest_data_file(step_dir: Path) -> Path:
    files = [p for p in step_dir.rglob("*") if p.is_file() and p.name != "integrity.json"]
    return max(files, key=lambda p: p.stat().st_size)


def _flip_bytes(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 64] = bytes(b ^ 0xFF for b in raw[mid:mid + 64])
    path.write_bytes(bytes(raw))


def _truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 3])


def _truncate_without_record(path: Path) -> None:
    """A step whose session died before sealing it: only the reader can tell.
    (The reader does not notice flipped bytes in array data; the record does.)"""
    _truncate(path)
    for record in path.parents:
        if (record / "integrity.json").exists():
            (record / "integrity.json").unlink()
            return


DAMAGE = {"flipped bytes": _flip_bytes, "truncated file": _truncate,
          "deleted file": Path.unlink, "truncated, no record": _truncate_without_record}


# ------------------------------------------------------------ damaged checkpoints


def test_every_checkpoint_is_sealed_with_sizes_and_hashes(reference):
    workdir, _ = reference
    assert _steps(workdir) == [STEPS - EVERY, STEPS]
    for step in _steps(workdir):
        step_dir = workdir / "checkpoints" / str(step)
        record = json.loads((step_dir / "integrity.json").read_text())["files"]
        data_file = _largest_data_file(step_dir)
        size, digest = record[data_file.relative_to(step_dir).as_posix()]
        assert size == data_file.stat().st_size and digest == file_digest(data_file)
        assert check_integrity(step_dir) is None


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_latest_checkpoint_falls_back_to_the_previous(reference, overrides, tmp_path,
                                                              damage, capsys):
    workdir = _interrupted_copy(reference, tmp_path)
    latest = workdir / "checkpoints" / str(STEPS)
    DAMAGE[damage](_largest_data_file(latest))
    if damage != "truncated, no record":
        assert check_integrity(latest) is not None
    capsys.readouterr()
    result = loop.run(_config(overrides), workdir, progress=False)
    err = capsys.readouterr().err
    assert f"skipped damaged checkpoint(s) in {workdir / 'checkpoints'} (step {STEPS}:" in err
    assert f"resuming from step {STEPS - EVERY}" in err
    assert (workdir / "checkpoints.damaged" / str(STEPS)).is_dir()  # kept for inspection
    assert result["status"] == "finished"
    _assert_same_as(reference, workdir, result)
    # The step was trained and saved again, and sealed.
    assert check_integrity(latest) is None and (latest / "integrity.json").exists()


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    return {p.relative_to(root).as_posix(): (p.stat().st_size, file_digest(p))
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_no_intact_checkpoint_is_one_line_and_exit_2(reference, overrides, tmp_path, capsys):
    workdir = _interrupted_copy(reference, tmp_path)
    for step in _steps(workdir):
        _truncate(_largest_data_file(workdir / "checkpoints" / str(step)))
    before = _snapshot(workdir)
    capsys.readouterr()
    assert cli_main(_argv(overrides, workdir)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"depthbench: error: checkpoints: none of the 2 checkpoint(s) in "
                          f"{workdir / 'checkpoints'} is intact (step {STEPS}: ")
    assert f"step {STEPS - EVERY}: " in err and "start the run over" in err
    assert _snapshot(workdir) == before  # nothing moved, nothing restarted from scratch


# -------------------------------------------------------------- real processes


def _env():
    # One device, as in this process, and its compile flags (bitwise comparisons).
    return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": subprocess_flags()}


_DRIVER = textwrap.dedent("""
    import os, signal, sys
    import orbax.checkpoint as ocp
    from depthbench.cli import main
    at, sig = int(sys.argv[1]), getattr(signal, sys.argv[2])
    real = ocp.CheckpointManager.save

    def save(self, step, *a, **k):
        out = real(self, step, *a, **k)  # asynchronous: the write is now in flight
        if step == at:
            os.kill(os.getpid(), sig)
        return out

    ocp.CheckpointManager.save = save
    sys.exit(main(sys.argv[3:]))
""")


def _drive(tmp_path, at: int, sig: str, argv) -> subprocess.CompletedProcess:
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    return subprocess.run([sys.executable, str(driver), str(at), sig, *argv], env=_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a real process: start-up and compilation
def test_sigterm_during_a_checkpoint_write(reference, overrides, tmp_path):
    """SIGTERM while step 16 is being written: the write completes, the run
    stops there (exit 0), every checkpoint is intact, and the resume is exact."""
    workdir = tmp_path / "run"
    proc = _drive(tmp_path, 2 * EVERY, "SIGTERM", _argv(overrides, workdir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "received SIGTERM" in proc.stderr
    assert f"preempted at step {2 * EVERY}" in proc.stdout
    assert _steps(workdir) == [EVERY, 2 * EVERY]
    for step in _steps(workdir):
        step_dir = workdir / "checkpoints" / str(step)
        assert (step_dir / "integrity.json").exists() and check_integrity(step_dir) is None
    _assert_same_as(reference, workdir, loop.run(_config(overrides), workdir, progress=False))


@pytest.mark.slow  # a real process: start-up and compilation
def test_kill_9_during_a_checkpoint_write(reference, overrides, tmp_path):
    """kill -9 while step 16 is being written: step 8 stays usable and the
    re-run reproduces the uninterrupted losses."""
    workdir = tmp_path / "run"
    proc = _drive(tmp_path, 2 * EVERY, "SIGKILL", _argv(overrides, workdir))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert EVERY in _steps(workdir)
    assert check_integrity(workdir / "checkpoints" / str(EVERY)) is None
    assert not (workdir / "result.json").exists()
    _assert_same_as(reference, workdir, loop.run(_config(overrides), workdir, progress=False))


def _kill_when_logged(proc: subprocess.Popen, metrics: Path, step: int) -> int:
    """SIGKILL ``proc`` once ``metrics`` has a row for ``step``; the last step logged."""
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        rows = read_jsonl(metrics)
        if rows and rows[-1]["step"] >= step:
            proc.kill()
            break
        time.sleep(0.005)
    proc.wait()
    return read_jsonl(metrics)[-1]["step"]


@pytest.mark.slow  # a real process: start-up and compilation
def test_kill_9_at_a_random_step_then_rerun_is_bitwise(reference, overrides, tmp_path):
    step = random.Random().randrange(2, STEPS - 1)
    workdir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "depthbench", *_argv(overrides, workdir)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    killed_at = _kill_when_logged(proc, workdir / "metrics.jsonl", step)
    assert proc.returncode == -signal.SIGKILL, f"kill at step {step}: {proc.stderr.read()[-2000:]}"
    assert killed_at < STEPS and not (workdir / "result.json").exists(), f"step {step}"
    result = loop.run(_config(overrides), workdir, progress=False)
    _assert_same_as(reference, workdir, result)


SWEEP_SPEC = """
from depthbench.config import load

def get_config():
    return load({base!r}, {overrides!r})

def get_sweep():
    return [{{"train.seed": s}} for s in (0, 1)]
"""


@pytest.mark.slow  # a real process: start-up and compilation
def test_a_killed_sweep_resumes_without_retraining_or_losing_rows(overrides, tmp_path):
    spec = tmp_path / "sweep_spec.py"
    spec.write_text(SWEEP_SPEC.format(base=BASE, overrides=[f"--config.{o}" for o in overrides]))
    workdir = tmp_path / "sweep"
    argv = [sys.executable, "-m", "depthbench", "sweep", "--config", str(spec),
            "--workdir", str(workdir), "--no-progress"]
    proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    runs = sorted(p for p in workdir.glob("*") if p.is_dir()) if workdir.exists() else []
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:  # kill inside the second run
        runs = sorted(p for p in workdir.iterdir() if p.is_dir()) if workdir.exists() else []
        done = [p for p in runs if (p / "result.json").exists()]
        if len(done) == 1 and any(len(read_jsonl(p / "metrics.jsonl")) > EVERY + 2
                                  for p in runs if p not in done):
            proc.kill()
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]
    first = [p for p in runs if (p / "result.json").exists()]
    assert len(first) == 1
    finished_before = {p.name: _snapshot(p) for p in first}
    rows_before = (workdir / "results.csv").read_text().splitlines()

    rerun = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for name, snap in finished_before.items():  # not retrained: not a byte changed
        assert _snapshot(workdir / name) == snap
    rows = (workdir / "results.csv").read_text().splitlines()
    assert rows[0] == rows_before[0] and len(rows) == 1 + 2
    for row in rows_before[1:]:
        name = row.split(",")[0]
        assert any(r.startswith(name + ",") for r in rows)
    for run in (p for p in workdir.iterdir() if p.is_dir()):
        result = json.loads((run / "result.json").read_text())
        assert result["status"] == "finished" and result["steps"] == STEPS
        steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl")]
        assert steps == list(range(1, STEPS + 1))  # one uninterrupted log per run


# ------------------------------------------------------------------ full disk


def _depthbench_with_file_size_limit(limit: int, argv) -> subprocess.CompletedProcess:
    """``depthbench argv`` where no file may grow past ``limit`` bytes: writes
    beyond it fail with EFBIG, through the real write paths (Python's own
    files, TensorStore's C++ writers), as on a full disk."""
    launcher = ("import resource, runpy, sys\n"
                f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
                "sys.argv = ['depthbench', *sys.argv[1:]]\n"  # Python ignores SIGXFSZ
                "runpy.run_module('depthbench', run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", launcher, *argv], env=_env(),
                          capture_output=True, text=True, timeout=300)


def _the_error_line(stderr: str) -> str:
    """The run's one error line.  depthbench itself prints exactly one line; Orbax's
    and TensorStore's background writers may still print their own reports
    (asyncio "Task exception was never retrieved", C++ tracebacks of callbacks that
    found the event loop closed) racing the exit.  Those come from other threads
    and cannot be silenced from Python, so only depthbench's own lines are counted."""
    # stripped: another thread's indented traceback may be mid-line when ours lands
    ours = [ln.strip() for ln in stderr.splitlines() if ln.strip().startswith("depthbench")]
    errors = [line for line in ours if line.startswith("depthbench: error: ")]
    assert len(errors) == 1 and ours == errors, stderr[-3000:]
    return errors[0]


def _killed_before_the_last_checkpoint(reference, tmp_path) -> Path:
    """A run killed after its checkpoint at step 24 (its log runs on to step 32)."""
    workdir = _interrupted_copy(reference, tmp_path)
    shutil.rmtree(workdir / "checkpoints" / str(STEPS))
    return workdir


@pytest.mark.slow  # a real process: start-up and compilation
def test_full_disk_while_writing_a_checkpoint(reference, overrides, tmp_path):
    workdir = _killed_before_the_last_checkpoint(reference, tmp_path)
    kept = STEPS - EVERY
    sealed = _snapshot(workdir / "checkpoints" / str(kept))
    limit = 32_000
    assert _largest_data_file(workdir / "checkpoints" / str(kept)).stat().st_size > limit
    proc = _depthbench_with_file_size_limit(limit, _argv(overrides, workdir))
    assert proc.returncode == 4, proc.stderr[-3000:]
    last = _the_error_line(proc.stderr)
    assert last == (f"depthbench: error: checkpoints: could not write step {STEPS} to "
                    f"{workdir / 'checkpoints'} (File too large); earlier checkpoints are intact: "
                    "free space and re-run the same command to resume"), proc.stderr[-3000:]
    assert _snapshot(workdir / "checkpoints" / str(kept)) == sealed
    assert _steps(workdir) == [kept]  # no half-written step left as a checkpoint
    assert not (workdir / "result.json").exists()
    # With room again, the same command resumes and finishes exactly.
    _assert_same_as(reference, workdir, loop.run(_config(overrides), workdir, progress=False))


@pytest.mark.slow  # a real process: start-up and compilation
def test_full_disk_while_writing_metrics(reference, overrides, tmp_path):
    workdir = _killed_before_the_last_checkpoint(reference, tmp_path)
    sealed = _snapshot(workdir / "checkpoints")
    config_json = (workdir / "config.json").read_text()
    rows = (workdir / "metrics.jsonl").read_text().splitlines(keepends=True)
    limit = len("".join(rows[:STEPS - EVERY + 2]).encode())  # room for two more rows
    proc = _depthbench_with_file_size_limit(
        limit, _argv(overrides, workdir, "train.checkpoint_every=1000"))
    assert proc.returncode == 4, proc.stderr[-3000:]
    last = _the_error_line(proc.stderr)
    assert last == (f"depthbench: error: metrics: could not write {workdir / 'metrics.jsonl'} "
                    "(File too large); earlier checkpoints are intact: free space and re-run the "
                    "same command to resume"), proc.stderr[-3000:]
    assert [r["step"] for r in read_jsonl(workdir / "metrics.jsonl")] == list(
        range(1, STEPS - EVERY + 3))  # the row torn by the full disk is not read
    assert _snapshot(workdir / "checkpoints") == sealed
    assert (workdir / "config.json").read_text() == config_json
    assert not (workdir / "result.json").exists()
    _assert_same_as(reference, workdir, loop.run(_config(overrides), workdir, progress=False))
