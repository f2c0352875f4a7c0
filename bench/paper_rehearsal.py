"""A paper-scale rehearsal on a CPU: the real paper-400m shapes, stopped and resumed.

    python -m bench.paper_rehearsal                            # pre_ln at L16 and L70
    python -m bench.paper_rehearsal --families pre_ln,attnres_full --depths 70 --steps 6

Before a cluster is spent on the paper's suite, this runs its shallowest and
deepest shapes (paper-400m: L16 at d 1216 and L70 at d 640, ~400M parameters
each, bf16 weights and compute, the spec's recipe) through the ``depthbench
train`` command on synthetic token shards, with everything a long run does:
evaluation, checkpoints, a stop by SIGTERM and the resume.  Per (family,
depth), in a scratch folder:

1. ``--steps`` steps uninterrupted;
2. the same run from scratch, sent SIGTERM once half the steps are logged (it
   checkpoints where it is and exits), then the same command again: it resumes
   and finishes.

Reported: every step's loss of both (the resumed run's must equal the
uninterrupted one's, ``==``), seconds per step, the peak resident memory of
each process, and the run directory's size.  A row of 1 x ``--seq-len``
tokens (256: the shapes are the paper's, the tokens per step are a CPU's;
``--seq-len 2048`` for the paper's).  The synthetic shards are uint16 token
ids (vocabulary 50280, documents of 100-1000 tokens ending in EOS 0; 10%
of them held out), as
``depthbench data tokenize`` writes FineWeb-Edu's.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import common

VOCAB, EOS = 50280, 0
# The recipe the rehearsal keeps small: a few steps, little validation, logs every step.
OVERRIDES = ("train.log_every=1", "train.eval_every={steps}", "data.val_windows=2",
             "train.batch_size=1", "train.seq_len={seq_len}", "train.steps={steps}",
             "train.checkpoint_every={steps}", "train.layer_stats_every=0",
             "data.val_fraction=0.1")


def write_shards(folder: Path, tokens: int, seed: int = 0) -> str:
    """Two uint16 ``.npy`` shards of ``tokens`` synthetic tokens in documents
    that end in EOS; returns their glob."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for shard in range(2):
        out, n = [], 0
        while n < tokens // 2:
            doc = rng.integers(1, VOCAB, int(rng.integers(100, 1000)), dtype=np.uint16)
            out += [doc, np.asarray([EOS], np.uint16)]
            n += doc.size + 1
        np.save(folder / f"shard_{shard:02d}.npy", np.concatenate(out))
    return str(folder / "*.npy")


def command(workdir: Path, family: str, depth: int, shards: str, steps: int,
            seq_len: int) -> list[str]:
    fields = [o.format(steps=steps, seq_len=seq_len) for o in OVERRIDES]
    fields += [f"model.family={family}", f"model.depth={depth}", f"data.paths={shards}"]
    return [sys.executable, "-m", "depthbench", "train", "--config", "paper_400m",
            "--workdir", str(workdir), *(f"--config.{f}" for f in fields)]


def run(argv: list[str], log: Path, stop_at_step: int | None = None) -> dict:
    """``argv`` in a child process, its output appended to ``log``; with
    ``stop_at_step``, SIGTERM once its progress bar shows that step done.
    Returns its exit status, wall seconds and peak RSS (GiB)."""
    rss_file = log.with_suffix(".rss")
    # The child's peak RSS: a wrapper process whose only child it is.
    wrapper = ("import resource, subprocess, sys; r = subprocess.call(sys.argv[2:]); "
               "open(sys.argv[1], 'w').write(str(resource.getrusage("
               "resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(r)")
    start = time.perf_counter()
    with open(log, "a") as f:
        proc = subprocess.Popen([sys.executable, "-c", wrapper, str(rss_file), *argv],
                                stdout=f, stderr=subprocess.STDOUT, cwd=common.ROOT)
        sent = False
        while proc.poll() is None:
            if stop_at_step is not None and not sent and _steps_done(log) >= stop_at_step:
                for child in _children(proc.pid):
                    os.kill(child, signal.SIGTERM)
                sent = True
            time.sleep(0.2)
    return {"code": proc.returncode, "seconds": time.perf_counter() - start,
            "rss_gib": int(rss_file.read_text()) / 2**20, "stopped": sent}


def _steps_done(log: Path) -> int:
    """The last step the log's progress bar shows done (``| 2/4 [``)."""
    done = re.findall(r"\| (\d+)/\d+ \[", log.read_text(errors="replace"))
    return int(done[-1]) if done else 0


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def _metrics(workdir: Path) -> list[dict]:
    """The run's logged rows (none before its first step)."""
    from depthbench.rundir.io import read_jsonl
    from depthbench.rundir.names import METRICS_FILE

    return read_jsonl(workdir / METRICS_FILE)


def losses(workdir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _metrics(workdir) if "loss" in r}


def seconds_per_step(workdir: Path) -> float:
    """Median seconds per step from the logged throughput (the first step, with
    its compile, left out)."""
    times = [r["tokens"] / r["step"] / r["tokens_per_sec"] for r in _metrics(workdir)[1:]
             if r.get("tokens_per_sec")]
    return float(np.median(times)) if times else float("nan")


def du_gib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**30


def rehearse(root: Path, family: str, depth: int, shards: str, steps: int, seq_len: int) -> dict:
    name = f"{family}-L{depth}"
    whole, parted = root / f"{name}-whole", root / f"{name}-stopped"
    first = run(command(whole, family, depth, shards, steps, seq_len), root / f"{name}-whole.log")
    stopped = run(command(parted, family, depth, shards, steps, seq_len),
                  root / f"{name}-stopped.log", stop_at_step=steps // 2)
    stop_step = max((r["step"] for r in _metrics(parted)), default=0)
    resumed = run(command(parted, family, depth, shards, steps, seq_len),
                  root / f"{name}-resumed.log")
    log = root / f"{name}-*.log"
    a, b = losses(whole), losses(parted)
    same = (first["code"] == 0 and resumed["code"] == 0 and a == b and len(a) == steps
            and stopped["stopped"] and stop_step < steps)
    return {"family": family, "L": depth, "steps": steps,
            "stopped after": (f"step {stop_step} (exit {stopped['code']})" if stopped["stopped"]
                              and stop_step < steps else "NOT STOPPED (it finished first)"),
            "losses": "equal (==)" if same else
                      f"DIFFER (exit {first['code']}/{resumed['code']}; log {log}): {a} vs {b}",
            "last loss": f"{a.get(steps, float('nan')):.4f}",
            "s/step": f"{seconds_per_step(whole):.1f}",
            "peak RSS GiB (whole / stopped / resumed)":
                f"{first['rss_gib']:.1f} / {stopped['rss_gib']:.1f} / {resumed['rss_gib']:.1f}",
            "run dir GiB": f"{du_gib(whole):.2f}",
            "wall s (whole / stopped + resumed)":
                f"{first['seconds']:.0f} / {stopped['seconds'] + resumed['seconds']:.0f}"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="pre_ln")
    parser.add_argument("--depths", default="16,70", help="rows of the paper-400m table")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--workdir", default="/tmp/depthbench-paper-rehearsal")
    args = parser.parse_args(argv)
    if args.steps < 4:
        # the loop dispatches a step before reading the last one's metrics: a stop
        # asked at half of them must leave a step or more to resume
        parser.error("--steps: at least 4 (the stop comes at half of them)")
    root = Path(args.workdir)
    if root.exists() and any(root.iterdir()):
        parser.error(f"--workdir: {root} is not empty (each rehearsal starts from nothing)")
    root.mkdir(parents=True, exist_ok=True)
    tokens = 4 * args.steps * args.seq_len + 64 * args.seq_len  # training rows and validation
    shards = write_shards(root / "shards", tokens)
    print(common.header("paper-400m rehearsal on this machine: stop by SIGTERM, resume"))
    rows = []
    for family in args.families.split(","):
        for depth in (int(d) for d in args.depths.split(",")):
            rows.append(rehearse(root, family, depth, shards, args.steps, args.seq_len))
            print(f"{family} L{depth}: {rows[-1]['losses']}", flush=True)
    print(f"paper-400m spec, 1 x {args.seq_len} tokens a step, {args.steps} steps; "
          f"logs in {root}")
    print(common.table(rows))
    return 0 if all(r["losses"].startswith("equal") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
