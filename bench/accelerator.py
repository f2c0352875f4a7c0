"""Everything an accelerator can tell in a few minutes, in one call.

    python -m bench.accelerator                 # on a GPU or TPU host: ~9 minutes at most
    python -m bench.accelerator --dry --out /tmp/acc   # tiny shapes on a CPU: proves the script

Parts (bench/accelerator_parts.py), in this order, each under its own
deadline: ``versions`` (jax, jaxlib, plugins, the device and its peaks),
``mfu`` (the 400M pre_ln L24 bf16 train step), ``families`` (hc, mhc,
attnres_block, attnres_full, moda against pre_ln at L32, ``model.impl``
xla and pallas), ``kernels`` (the Pallas kernels alone against XLA),
``precision`` (bf16 against fp32 losses over 30 steps), ``memory``
(compiled memory at L70) and ``inference`` (decode latency and KV cache of
pre_ln from L16 to L70, ``bench/inference.py``).

One worker process runs the parts in turn and appends each row to an
events file as soon as it has it; this process never touches the device
(on a GPU, the first process to do so takes most of its memory).  It
watches the worker: a part that outlives its deadline is killed with the
worker, reported as timed out with the rows it had finished, and a new
worker goes on with the next part, so a hang in one part cannot eat the
others' time.  The table is written to
``bench/results/accelerator-<device>-<date>.md`` (``--out``: another file
or folder) and printed.  Exit status 0 when every part finished, 1 if one
failed or timed out, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common

# Deadlines (seconds) of each part on an accelerator; their sum plus one worker
# start stays under 9 minutes.  A CPU --dry run gets DRY_DEADLINE for each: the
# deadlines are a watchdog there, not a budget.
DEADLINES = {"versions": 30, "mfu": 100, "families": 170, "kernels": 50, "precision": 60,
             "memory": 40, "inference": 60}
TITLES = {
    "versions": "versions, device and peaks",
    "mfu": "MFU: 400M pre_ln L24 train step, bf16",
    "families": "step time and memory relative to pre_ln at L32, impl xla and pallas",
    "kernels": "the kernels alone: Pallas against XLA, forward and backward",
    "precision": "bf16 against fp32 losses, routing families",
    "memory": "memory at L70",
    "inference": "serving: decode latency and KV cache against depth, L16 to L70",
}
DRY_DEADLINE = 300
STARTUP = 90  # a worker's imports and device start
POLL = 0.2


# ---------------------------------------------------------------- worker
def worker(parts: list[str], events: Path, dry: bool, hang: str) -> int:
    """Run ``parts`` in order, appending one JSON line per event to ``events``."""
    import traceback

    from bench import accelerator_parts

    with open(events, "a", encoding="utf-8") as fh:
        def emit(name: str, kind: str, payload: dict) -> None:
            fh.write(json.dumps({"part": name, "kind": kind, **payload}) + "\n")
            fh.flush()

        for name in parts:
            emit(name, "start", {})
            part = accelerator_parts.Part(dry, lambda kind, p, name=name: emit(name, kind, p))
            try:
                if name == hang:  # tests: a part that never returns, for the watchdog
                    time.sleep(10**6)
                seconds = accelerator_parts.run(name, part)
                emit(name, "done", {"seconds": seconds})
            except Exception:  # one broken part must not stop the others
                emit(name, "error", {"text": traceback.format_exc(limit=4)})
    return 0


# ---------------------------------------------------------------- watchdog
class Results:
    """What the worker(s) reported, per part, read from the events file."""

    def __init__(self, parts: list[str]):
        self.parts = parts
        self.rows: dict[str, dict[str, list[dict]]] = {p: {} for p in parts}
        self.notes: dict[str, list[str]] = {p: [] for p in parts}
        self.status: dict[str, str] = {p: "not run" for p in parts}
        self.meta: dict[str, str] = {}
        self.finished: set[str] = set()
        self.current: str | None = None
        self.offset = 0

    def read(self, events: Path) -> bool:
        """Take in new complete lines; True if the current part changed."""
        if not events.exists():
            return False
        with open(events, encoding="utf-8") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        lines = chunk.split("\n")
        self.offset += len(chunk) - len(lines[-1])  # an unfinished last line waits
        changed = False
        for line in lines[:-1]:
            e = json.loads(line)
            name, kind = e["part"], e["kind"]
            if kind == "start":
                self.current, changed = name, True
                self.status[name] = "running"
            elif kind == "row":
                self.rows[name].setdefault(e["table"], []).append(e["row"])
            elif kind == "note":
                self.notes[name].append(e["text"])
            elif kind == "meta":
                self.meta.update({k: v for k, v in e.items() if k not in ("part", "kind")})
            else:
                self.status[name] = (f"done in {e['seconds']:.0f} s" if kind == "done"
                                     else "FAILED:\n```\n" + e["text"].rstrip() + "\n```")
                self.finished.add(name)
                self.current, changed = None, True
        return changed


def _stop(proc: subprocess.Popen) -> None:
    """End the worker we started, and anything it started (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def watch(parts: list[str], deadlines: dict[str, float], dry: bool, hang: str,
          log=print) -> Results:
    """Run the parts in workers under their deadlines; every part ends up done,
    failed, timed out or crashed."""
    results = Results(parts)
    with tempfile.TemporaryDirectory(prefix="bench-accelerator-") as tmp:
        events, stderr_path = Path(tmp) / "events.jsonl", Path(tmp) / "worker.err"
        env = dict(os.environ)
        if dry and "JAX_COMPILATION_CACHE_DIR" not in env:
            # --dry's parts share their programs (accelerator_parts.DRY_OVERRIDES):
            # each compiles once, for this run (and for a worker restarted after a hang).
            env["JAX_COMPILATION_CACHE_DIR"] = str(Path(tmp) / "xla-cache")
            env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        todo = list(parts)
        while todo:
            cmd = [sys.executable, "-m", "bench.accelerator", "--worker", ",".join(todo),
                   "--events", str(events)] + (["--dry"] if dry else []) + (
                       ["--hang", hang] if hang else [])
            with open(stderr_path, "w") as err:
                proc = subprocess.Popen(cmd, cwd=common.ROOT, env=env, stdout=subprocess.DEVNULL,
                                        stderr=err, start_new_session=True)
            since, deadline, timed_out, started = time.monotonic(), STARTUP, False, False
            while True:
                alive = proc.poll() is None  # before reading: a dead worker's lines are all in
                if results.read(events):  # a part started or ended: its deadline starts
                    since = time.monotonic()
                    deadline = deadlines[results.current] if results.current else STARTUP
                    for name in [n for n in todo if n in results.finished]:
                        log(f"{name}: {results.status[name].splitlines()[0]}")
                    todo = [n for n in todo if n not in results.finished]
                    if results.current:
                        started = True
                        log(f"{results.current}: started (deadline {deadline:.0f} s)")
                if not alive:
                    break
                if time.monotonic() - since > deadline:
                    timed_out = True
                    _stop(proc)
                    results.read(events)  # rows written before the kill
                    break
                time.sleep(POLL)
            todo = [n for n in todo if n not in results.finished]
            if not todo:
                break
            if not started:  # no worker would start any better: the rest is not run
                tail = stderr_path.read_text(errors="replace").strip()[-600:]
                why = (f"not started within {STARTUP} s" if timed_out
                       else f"exited with status {proc.returncode}")
                for name in todo:
                    results.status[name] = f"NOT RUN: the worker {why}\n```\n{tail}\n```"
                log(f"{', '.join(todo)}: not run (the worker {why})")
                break
            stuck = results.current or todo[0]  # a crash between two parts: the next one
            if timed_out:
                results.status[stuck] = (
                    f"TIMED OUT after {time.monotonic() - since:.0f} s (deadline {deadline:.0f} s)"
                    + ("; the rows above are those it finished" if results.rows[stuck] else ""))
            else:
                tail = stderr_path.read_text(errors="replace").strip()[-600:]
                results.status[stuck] = (f"CRASHED: the worker exited with status "
                                         f"{proc.returncode}\n```\n{tail}\n```")
            log(f"{stuck}: {results.status[stuck].splitlines()[0]}")
            results.finished.add(stuck)
            results.current = None
            todo.remove(stuck)
    return results


# ---------------------------------------------------------------- report
def report(results: Results, dry: bool, seconds: float, argv: list[str]) -> str:
    kind = results.meta.get("device_kind", "unknown device")
    lines = [f"# depthbench on {kind}{' (--dry: tiny shapes, CPU)' if dry else ''}", "",
             f"`python -m bench.accelerator {' '.join(argv)}`".replace("  ", " ") +
             f": {seconds:.0f} s wall, parts {', '.join(results.parts)}", ""]
    for name in results.parts:
        lines += [f"## {name}: {TITLES[name]}", ""]
        for table, rows in results.rows[name].items():
            columns = list(dict.fromkeys(k for r in rows for k in r))  # a FAILED row adds one
            lines += [f"{table}:", "", common.table(rows, columns), ""]
        lines += [*(n for n in results.notes[name]), "", f"**{results.status[name]}**", ""]
    return "\n".join(lines).rstrip() + "\n"


def default_name(results: Results, dry: bool) -> str:
    kind = results.meta.get("device_kind", "unknown")
    slug = re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-") or "unknown"
    date = datetime.date.today().isoformat()
    return f"accelerator-{slug}{'-dry' if dry else ''}-{date}.md"


def output_path(out: str, name: str) -> Path:
    """``--out``: a ``.md`` file, or a folder to put ``name`` in; default bench/results/."""
    if not out:
        return common.ROOT / "bench" / "results" / name
    path = Path(out)
    return path if path.suffix == ".md" else path / name


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------- command line
def _parser():
    from depthbench.cli import _Parser

    p = _Parser(prog="python -m bench.accelerator", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry", action="store_true",
                   help="tiny shapes on this machine (CPU: kernels interpreted)")
    p.add_argument("--out", default="", help="report file (.md) or folder "
                   "(default bench/results/accelerator-<device>-<date>.md)")
    p.add_argument("--only", default="", help=f"comma-separated parts of {', '.join(TITLES)}")
    p.add_argument("--timeout", action="append", default=[], metavar="PART=SECONDS",
                   help="another deadline for a part (repeatable)")
    p.add_argument("--hang", default="", help="tests: this part sleeps instead of measuring")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)  # parts, in a worker
    p.add_argument("--events", default="", help=argparse.SUPPRESS)
    return p


def _parts_and_deadlines(p, args) -> tuple[list[str], dict[str, float]]:
    parts = [s for s in args.only.split(",") if s] or list(TITLES)
    unknown = [s for s in parts + ([args.hang] if args.hang else []) if s not in TITLES]
    if unknown:
        p.error(f"--only/--hang: unknown part {unknown[0]!r}; allowed: {', '.join(TITLES)}")
    deadlines = {k: float(DRY_DEADLINE if args.dry else v) for k, v in DEADLINES.items()}
    for item in args.timeout:
        name, _, value = item.partition("=")
        if name not in TITLES or not re.fullmatch(r"\d+(\.\d+)?", value) or float(value) <= 0:
            p.error(f"--timeout: {item!r} is not PART=SECONDS with PART one of "
                    f"{', '.join(TITLES)} and SECONDS > 0")
        deadlines[name] = float(value)
    return parts, deadlines


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _parser()
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker.split(","), Path(args.events), args.dry, args.hang)
    parts, deadlines = _parts_and_deadlines(p, args)
    if args.out and Path(args.out).suffix == ".md" and not Path(args.out).parent.is_dir():
        p.error(f"--out: folder {Path(args.out).parent} does not exist")
    if args.out and Path(args.out).suffix != ".md" and not Path(args.out).is_dir():
        p.error(f"--out: {args.out} is neither a .md file nor an existing folder")
    budget = sum(deadlines[k] for k in parts)
    print(f"bench.accelerator: parts {', '.join(parts)}; at most {budget:.0f} s of deadlines "
          f"plus worker starts", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    results = watch(parts, deadlines, args.dry, args.hang,
                    log=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    text = report(results, args.dry, time.monotonic() - t0, argv)
    path = output_path(args.out, default_name(results, args.dry))
    write_atomic(path, text)
    print(text, flush=True)
    print(f"(written to {path})", file=sys.stderr)
    return 0 if all(s.startswith("done") for s in results.status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
