"""Sweeps: expand a sweep spec into runs, train them in order, keep results.csv.

A sweep spec is an experiment file whose ``get_config()`` gives the shared
settings and whose ``get_sweep()`` returns one override dict per run
(``{"model.family": "hc", "model.depth": 8, "train.lr": 3e-3}``).  Overrides
from the command line apply to every run; a run's own overrides win, and
overriding a swept field on the command line is an error (it would silently
do nothing).

A sweep directory holds one subdirectory per run, named from its overrides
(``hc-L8-lr3e-03``), ``sweep.json`` (the expanded sweep) and ``results.csv``
(one row per run, rewritten atomically after every run).  The state of a run
is read from its directory, never from memory, so any number of sweep
processes (``--shard i/N`` or not) can share one directory:

* ``result.json`` present: done (or diverged, as it records) -- skipped;
* ``sweep.lock`` held by a live process: running elsewhere -- skipped now,
  looked at again at the end;
* ``failure.txt`` present: the trainer raised -- retried by the next sweep;
* otherwise pending; an interrupted run resumes from its checkpoints
  (the trainer does that).

``sweep_run.json`` records the config a run was started with; resuming or
skipping a run whose config has since changed is refused (one line naming
the fields), so a results table never mixes two recipes under one name.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import re
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Any

import ml_collections
from etils import epath

from depthbench import config as cfglib
from depthbench import shapes
from depthbench.config import ConfigError

RESULT_COLUMNS = (
    "name", "family", "suite", "depth", "d_model", "aspect_ratio", "lr", "params", "seq_len",
    "steps", "tokens", "final_val_loss", "tokens_per_sec", "mfu", "diverged_at_step",
    "wall_seconds", "status",
)
STATUSES = ("done", "diverged", "failed", "pending", "running")
FINISHED = ("done", "diverged")

RESULT_FILE = "result.json"
FAILURE_FILE = "failure.txt"
LOCK_FILE = "sweep.lock"
RUN_RECORD = "sweep_run.json"
MANIFEST = "sweep.json"
RESULTS_CSV = "results.csv"

# Fields a run may resume with other values of (the trainer checks the same list).
EXECUTION_FIELDS = cfglib.RUNTIME_FIELDS

Runner = Callable[..., dict]


# ------------------------------------------------------------------ naming

_SAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def _fmt_number(value: float) -> str:
    """The shortest e-notation that reads back exactly: 3e-03, 2.5e-03."""
    for digits in range(0, 16):
        text = f"{value:.{digits}e}"
        if float(text) == value:
            return text
    return repr(value)


def fmt_lr(lr: float | None) -> str:
    """A learning rate as run names write it: 3e-03, 2.5e-03 ('-' if unknown)."""
    return "-" if lr is None else _fmt_number(float(lr))


def _fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value) and abs(value) < 1e5:
            return str(int(value))
        return _fmt_number(value) if math.isfinite(value) else str(value)
    return str(value)


def run_name(overrides: dict[str, Any]) -> str:
    """A stable, filesystem-safe directory name for a run's overrides.

    Family first, then suite (``paper-`` dropped), ``L{depth}``, ``d{d_model}``,
    ``lr{lr}``, then every other field as ``{leaf}{value}`` in key order:
    ``{"model.family": "hc", "model.depth": 8, "train.lr": 0.003}`` ->
    ``hc-L8-lr3e-03``.  A ``name`` override is used as given.
    """
    if "name" in overrides:
        return _SAFE.sub("_", str(overrides["name"])).strip("._") or "run"
    parts = []
    lead = {
        "model.family": lambda v: str(v),
        "model.suite": lambda v: str(v).removeprefix("paper-") or "rule",
        "model.depth": lambda v: f"L{v}",
        "model.d_model": lambda v: f"d{v}",
        "train.lr": lambda v: f"lr{_fmt_number(float(v))}",
    }
    for key, fmt in lead.items():
        if key in overrides:
            parts.append(fmt(overrides[key]))
    for key in sorted(k for k in overrides if k not in lead):
        leaf, value = key.rsplit(".", 1)[-1], _fmt_value(overrides[key])
        parts.append(f"{leaf}{value}" if value[:1].isdigit() else f"{leaf}-{value}")
    name = _SAFE.sub("_", "-".join(parts)).strip("._")
    return name or "run"


# --------------------------------------------------------------- expansion


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep: its position, name, overrides and resolved config."""

    index: int
    name: str
    overrides: tuple[tuple[str, Any], ...]
    config: ml_collections.ConfigDict = dataclasses.field(compare=False, repr=False)

    @property
    def shape(self) -> shapes.Shape:
        return shapes.resolve_shape(self.config)

    def static_row(self) -> dict:
        """The results.csv row known before training (no measured values)."""
        c, s = self.config, self.shape
        try:
            from depthbench import costs
            from depthbench.model.spec import ModelSpec

            params = costs.param_count(ModelSpec.from_config(c))
        except Exception:  # a family without cost hooks yet: the backbone count
            params = s.total_params
        return {
            "name": self.name, "family": c.model.family, "suite": c.model.suite,
            "depth": s.depth, "d_model": s.d_model, "aspect_ratio": round(s.aspect_ratio, 4),
            "lr": float(c.train.lr), "params": int(params), "seq_len": int(c.train.seq_len),
            "steps": int(c.train.steps),
            "tokens": int(c.train.steps) * int(c.train.batch_size) * int(c.train.seq_len),
            "final_val_loss": None, "tokens_per_sec": None, "mfu": None,
            "diverged_at_step": None, "wall_seconds": None, "status": "pending",
        }


@dataclasses.dataclass(frozen=True)
class Sweep:
    spec: str
    cli_overrides: tuple[str, ...]
    runs: tuple[Run, ...]

    def by_name(self) -> dict[str, Run]:
        return {r.name: r for r in self.runs}

    def select(self, *, shard: tuple[int, int] = (0, 1), names: Sequence[str] = (),
               indices: Sequence[int] = ()) -> list[Run]:
        """The runs of one shard (every N-th by sweep index), optionally only
        those matching ``names`` (exact or fnmatch patterns) or ``indices``."""
        i, n = shard
        chosen = [r for r in self.runs if r.index % n == i]
        if names:
            for pattern in names:
                if not any(fnmatchcase(r.name, pattern) for r in self.runs):
                    sample = ", ".join(r.name for r in self.runs[:3])
                    raise ConfigError(f"--run: no run of the sweep is named {pattern!r} "
                                      f"(names look like {sample}; see --list)")
            chosen = [r for r in chosen if any(fnmatchcase(r.name, p) for p in names)]
        if indices:
            for k in indices:
                if not 0 <= k < len(self.runs):
                    raise ConfigError(f"--only: index {k} is out of range; the sweep has "
                                      f"{len(self.runs)} runs (0 .. {len(self.runs) - 1})")
            chosen = [r for r in chosen if r.index in set(indices)]
        return chosen


def _override_key(text: str) -> str:
    text = text[2:] if text.startswith("--") else text
    text = text.removeprefix("config.")
    return text.split("=", 1)[0].strip()


def expand(spec: str | os.PathLike, cli_overrides: Iterable[str] = ()) -> Sweep:
    """Load a sweep spec and resolve every run's config (validated, no training)."""
    cli_overrides = tuple(cli_overrides)
    module = cfglib.import_spec(spec)
    if not callable(getattr(module, "get_sweep", None)):
        raise ConfigError(f"config: spec file {str(spec)!r} has no get_sweep(); "
                          "`depthbench train` runs a spec without one")
    base = module.get_config()
    if not isinstance(base, ml_collections.ConfigDict):
        raise ConfigError(f"config: get_config() in {str(spec)!r} must return a ConfigDict")
    base = cfglib.apply_overrides(base, cli_overrides)
    entries = list(module.get_sweep())
    if not entries:
        raise ConfigError(f"config: get_sweep() in {str(spec)!r} returned no runs")
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict) or not all(isinstance(key, str) for key in entry):
            raise ConfigError(f"config: get_sweep() in {str(spec)!r}: entry {k} must be a dict "
                              f"{{'section.field': value}}, got {entry!r}")
    swept = {key for entry in entries for key in entry}
    for text in cli_overrides:
        key = _override_key(text)
        if key in swept:
            raise ConfigError(f"--config.{key}: the sweep sets it per run ({str(spec)!r} "
                              "get_sweep()); select runs with --run NAME instead")
    runs, seen = [], {}
    for k, entry in enumerate(entries):
        name = run_name(entry)
        if name in seen:
            raise ConfigError(f"config: get_sweep() in {str(spec)!r}: runs {seen[name]} and {k} "
                              f"have the same name {name!r} (identical overrides?)")
        seen[name] = k
        try:
            config = cfglib.validate(cfglib.apply_overrides(base, entry))
        except ConfigError as e:
            raise ConfigError(f"sweep run {k} ({name}): {e}") from None
        runs.append(Run(k, name, tuple(entry.items()), config))
    return Sweep(str(spec), cli_overrides, tuple(runs))


def parse_shard(text: str | None) -> tuple[int, int]:
    """'1/4' -> (1, 4): run every 4th run starting at index 1 (0-based)."""
    if text is None:
        return (0, 1)
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise ConfigError(f"--shard: expected i/N with 0 <= i < N (e.g. 0/4), got {text!r}")
    return int(m.group(1)), int(m.group(2))


# ------------------------------------------------------------------- files


def as_path(path: str | os.PathLike) -> epath.Path:
    """A local or remote (gs://...) path; run directories may live in a bucket."""
    return epath.Path(path)


def is_local(path: epath.Path) -> bool:
    return "://" not in str(path)


def atomic_write(path: epath.Path, text: str) -> None:
    """Write a file so that readers see the old or the new content, never half."""
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _read_json(path: epath.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, OSError):
        return None


def config_changes(old: dict, new: dict) -> list[str]:
    """Fields (outside EXECUTION_FIELDS) whose values differ, as 'field old -> new'."""
    return [f"{key} {a!r} -> {b!r}" for key, a, b in cfglib.config_changes(old, new)]


# -------------------------------------------------------------------- lock


class RunLock:
    """An exclusive claim on a run directory by one sweep process.

    ``sweep.lock`` is created with O_CREAT|O_EXCL (atomic on local disks and
    NFS) and holds the owner's host and pid; a thread touches it every
    ``stale_after / 4`` seconds.  A lock is stale -- and is taken over -- when
    its owner is on this host and its pid is gone, or when it has not been
    touched for ``stale_after`` seconds (an owner on another host that died).
    Taking over is serialised by a second O_EXCL file so two processes never
    both break the same stale lock.
    """

    def __init__(self, run_dir: str | os.PathLike, *, stale_after: float = 600.0):
        self.path = os.path.join(str(run_dir), LOCK_FILE)
        self.stale_after = float(stale_after)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held = False

    # ---- inspection
    def holder(self) -> dict | None:
        """The owner record of the lock file, or None if unlocked."""
        try:
            with open(self.path) as f:
                record = json.load(f)
            record["age"] = time.time() - os.stat(self.path).st_mtime
            return record
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, OSError):
            # Being written this instant; the mtime rule still applies.
            try:
                return {"host": "?", "pid": -1, "age": time.time() - os.stat(self.path).st_mtime}
            except FileNotFoundError:
                return None

    def is_stale(self, record: dict) -> bool:
        if record.get("age", 0.0) > self.stale_after:
            return True
        if record.get("host") == socket.gethostname():
            return not _pid_alive(int(record.get("pid", -1)))
        return False

    def held_elsewhere(self) -> bool:
        record = self.holder()
        return record is not None and not self.is_stale(record) and not self.held

    # ---- acquire / release
    def acquire(self) -> bool:
        """Take the lock if free (or stale); False if a live process holds it."""
        for _ in range(3):
            if self._create():
                self.held = True
                self._start_heartbeat()
                return True
            record = self.holder()
            if record is None:
                continue  # released meanwhile: try again
            if not self.is_stale(record):
                return False
            self._break(record)
        return False

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.held:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.held = False

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # ---- internals
    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                  "argv": sys.argv[:6]}
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        return True

    def _break(self, stale: dict) -> None:
        breaker = self.path + ".break"
        try:
            fd = os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - os.stat(breaker).st_mtime > 60:  # a breaker that died
                    os.unlink(breaker)
            return
        os.close(fd)
        try:
            now = self.holder()
            # Still the same stale owner (not a fresh lock taken meanwhile)?
            same = now is not None and all(now.get(k) == stale.get(k)
                                           for k in ("host", "pid", "started"))
            if same and self.is_stale(now):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(breaker)

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        interval = max(0.05, self.stale_after / 4)

        def beat() -> None:
            while not self._stop.wait(interval):
                try:
                    os.utime(self.path)
                except FileNotFoundError:
                    return

        self._thread = threading.Thread(target=beat, name="sweep-lock-heartbeat", daemon=True)
        self._thread.start()


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


# ------------------------------------------------------------------ status


def read_row(run: Run, run_dir: epath.Path, *, stale_after: float = 600.0) -> dict:
    """The run's results.csv row as its directory says now."""
    row = run.static_row()
    result = _read_json(run_dir / RESULT_FILE)
    if result is not None:
        for key in ("params", "steps", "tokens", "final_val_loss", "tokens_per_sec", "mfu",
                    "diverged_at_step", "wall_seconds"):
            if result.get(key) is not None:
                row[key] = result[key]
        row["status"] = "diverged" if result.get("diverged") else "done"
        return row
    if is_local(run_dir) and RunLock(run_dir, stale_after=stale_after).held_elsewhere():
        row["status"] = "running"
    elif (run_dir / FAILURE_FILE).exists():
        row["status"] = "failed"
    return row


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "nan" if math.isnan(value) else str(value)
        return f"{value:.6g}" if abs(value) < 1e-3 or abs(value) >= 1e6 else f"{value:.6f}".rstrip(
            "0").rstrip(".")
    return str(value)


def rows_to_csv(rows: Sequence[dict], columns: Sequence[str] = RESULT_COLUMNS) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_value(row.get(c)) for c in columns])
    return buf.getvalue()


def recorded_run(run_dir: epath.Path) -> Run | None:
    """The Run a sweep recorded in ``run_dir`` (sweep_run.json), if any."""
    record = _read_json(run_dir / RUN_RECORD)
    if record is None or "config" not in record:
        return None
    return Run(int(record.get("index", -1)), str(record.get("name", run_dir.name)),
               tuple(record.get("overrides", {}).items()),
               ml_collections.ConfigDict(record["config"]))


def other_runs(sweep: Sweep, workdir: epath.Path) -> list[Run]:
    """Runs in ``workdir`` that earlier sweeps (other specs) recorded: a
    directory is the union of the sweeps run into it, so a spec that adds an
    aspect ratio or a family need not repeat the runs already there."""
    mine = {r.name for r in sweep.runs}
    found = []
    for record in sorted(workdir.glob(f"*/{RUN_RECORD}")):
        if record.parent.name not in mine:
            run = recorded_run(record.parent)
            if run is not None:
                found.append(dataclasses.replace(run, name=record.parent.name))
    return found


def write_results(sweep: Sweep, workdir: epath.Path, *, stale_after: float = 600.0,
                  cache: dict[str, dict] | None = None) -> list[dict]:
    """Rebuild results.csv from the run directories (atomically) and return its rows:
    the sweep's runs in order, then those earlier sweeps left in ``workdir``.

    ``cache`` keeps rows of finished runs between calls, so a long sweep does
    not re-read every result.json after each run.
    """
    rows = []
    for run in [*sweep.runs, *other_runs(sweep, workdir)]:
        if cache is not None and run.name in cache:
            rows.append(cache[run.name])
            continue
        row = read_row(run, workdir / run.name, stale_after=stale_after)
        if cache is not None and row["status"] in FINISHED:
            cache[run.name] = row
        rows.append(row)
    atomic_write(workdir / RESULTS_CSV, rows_to_csv(rows))
    return rows


def write_manifest(sweep: Sweep, workdir: epath.Path) -> None:
    manifest = {
        "spec": os.path.abspath(sweep.spec),
        "cli_overrides": list(sweep.cli_overrides),
        "runs": [{"index": r.index, "name": r.name, "overrides": dict(r.overrides)}
                 for r in sweep.runs],
    }
    atomic_write(workdir / MANIFEST, json.dumps(manifest, indent=1, default=str) + "\n")


def check_recorded(run: Run, run_dir: epath.Path) -> None:
    """Refuse to resume or skip a run that was started with a different config."""
    record = _read_json(run_dir / RUN_RECORD)
    if record is None or "config" not in record:
        return
    changes = config_changes(record["config"], run.config.to_dict())
    if changes:
        more = f" (+{len(changes) - 3} more)" if len(changes) > 3 else ""
        raise ConfigError(
            f"run {run.name!r} in {str(run_dir.parent)!r} was started with a different config: "
            f"{'; '.join(changes[:3])}{more}; use a new --workdir or delete {str(run_dir)!r}"
        )


def _record_run(run: Run, run_dir: epath.Path) -> None:
    record = {"name": run.name, "index": run.index, "overrides": dict(run.overrides),
              "config": run.config.to_dict()}
    atomic_write(run_dir / RUN_RECORD, json.dumps(record, indent=1, default=str) + "\n")


# --------------------------------------------------------------------- run


def default_runner(config: ml_collections.ConfigDict, workdir: str, *, progress: bool = True
                   ) -> dict:
    """The real trainer (imported late: a dry run needs no training stack)."""
    from depthbench.train.loop import run

    return run(config, workdir, progress=progress)


def _lead_process(after_run: bool) -> bool:
    """Whether this process writes the sweep's shared files.

    A single process always does.  In a multi-host job only process 0 does;
    its index is known from JAX_PROCESS_ID or SLURM_PROCID, or from JAX once the trainer
    has called jax.distributed.initialize() (JAX's backend must not be
    touched before that, so until then the other processes stay silent).
    """
    from depthbench.parallel import distributed_reason, env_process_index

    if distributed_reason() is None:
        return True
    index = env_process_index()  # JAX_PROCESS_ID or SLURM_PROCID
    if index is not None:
        return index == 0
    if not after_run:
        return False
    import jax

    return jax.process_index() == 0


@dataclasses.dataclass
class SweepOutcome:
    """What one sweep process did; ``rows`` is the final results.csv."""

    selected: list[str]
    trained: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    held_elsewhere: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    diverged: list[str] = dataclasses.field(default_factory=list)
    preempted: str | None = None  # the run stopped by SIGTERM/SIGINT (the sweep stopped)
    rows: list[dict] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed and self.preempted is None


def run_sweep(sweep: Sweep, workdir: str | os.PathLike, *, runs: Sequence[Run] | None = None,
              runner: Runner | None = None, lock: bool = True, progress: bool = True,
              stale_after: float = 600.0, log: Callable[[str], None] | None = None
              ) -> SweepOutcome:
    """Train ``runs`` (default: every run of ``sweep``) in order under ``workdir``.

    Finished runs are skipped, interrupted ones resumed (by the runner),
    diverged ones recorded, failures (the runner raised) recorded in the run's
    ``failure.txt`` and the sweep goes on.  With ``lock`` each run is claimed
    with a :class:`RunLock`; runs held by another process are retried once at
    the end.  ``lock=False`` is for a multi-host job in which every process
    trains the same run together.  results.csv is rewritten after every run.
    """
    from depthbench.parallel import distributed_reason

    runner = runner or default_runner
    workdir = as_path(workdir)
    runs = list(sweep.runs if runs is None else runs)
    if lock and not is_local(workdir):
        lock = False
        _say(log, f"note: no run locks on {workdir} (object store); give each sweep process "
                  "its own --shard or use --run")
    why = distributed_reason()
    if lock and why is not None:
        # Every process of a multi-host job trains the same run: one lock would
        # let one process in and leave the others waiting at the collectives.
        lock = False
        _say(log, f"note: multi-host job ({why}): no run locks; every process trains the "
                  "same runs together (the launchers give each job one --run)")
    lead = _lead_process(after_run=False)
    if lead:
        workdir.mkdir(parents=True, exist_ok=True)
        write_manifest(sweep, workdir)
    for run in runs:
        check_recorded(run, workdir / run.name)
    outcome = SweepOutcome(selected=[r.name for r in runs])
    cache: dict[str, dict] = {}
    ran_trainer = False
    status = "pending"

    def refresh() -> None:
        if _lead_process(ran_trainer):
            outcome.rows = write_results(sweep, workdir, stale_after=stale_after, cache=cache)

    if lead:
        refresh()
    bar = _progress_bar(len(runs), progress)
    try:
        deferred: list[Run] = []
        for attempt in (0, 1):
            queue, deferred = (runs, []) if attempt == 0 else (deferred, [])
            for run in queue:
                run_dir = workdir / run.name
                status = read_row(run, run_dir, stale_after=stale_after)["status"]
                if status in FINISHED:
                    outcome.skipped.append(run.name)
                    if status == "diverged":
                        outcome.diverged.append(run.name)
                    bar.update(1)
                    continue
                run_dir.mkdir(parents=True, exist_ok=True)
                claim = RunLock(run_dir, stale_after=stale_after) if lock else None
                if claim is not None and not claim.acquire():
                    if attempt == 0:
                        deferred.append(run)
                    else:
                        outcome.held_elsewhere.append(run.name)
                        bar.update(1)
                    continue
                try:
                    bar.set_postfix_str(run.name)
                    status = _train_one(run, run_dir, runner, progress, outcome, bar, lead)
                    ran_trainer = True
                finally:
                    if claim is not None:
                        claim.release()
                bar.update(1)
                refresh()
                if status == "preempted":
                    break
            if not deferred or outcome.preempted:
                break
    finally:
        bar.close()
        refresh()
    return outcome


def _train_one(run: Run, run_dir: epath.Path, runner: Runner, progress: bool,
               outcome: SweepOutcome, bar, lead: bool) -> str:
    """Train one claimed run; returns its status (done, diverged or failed)."""
    if lead:
        _record_run(run, run_dir)
    start = time.time()
    try:
        result = runner(run.config, str(run_dir), progress=progress)
    except ConfigError:
        raise  # bad input (data paths, a changed config): one line, exit 2, for every run alike
    except Exception as e:  # recorded, and the sweep goes on
        tb = traceback.format_exc()
        if _lead_process(after_run=True):
            atomic_write(run_dir / FAILURE_FILE, tb)
        outcome.failed.append(run.name)
        bar.write(f"{run.name}: FAILED after {time.time() - start:.0f} s: "
                  f"{type(e).__name__}: {e} (traceback in {run_dir / FAILURE_FILE})")
        return "failed"
    if result.get("status") == "preempted":
        # SIGTERM/SIGINT reached the trainer: it checkpointed; stop the whole sweep.
        outcome.preempted = run.name
        bar.write(f"{run.name}: stopped at step {result.get('step')} (signal); re-run the "
                  "sweep to resume it")
        return "preempted"
    if _lead_process(after_run=True):
        if not lead:
            _record_run(run, run_dir)
        if (run_dir / FAILURE_FILE).exists():
            (run_dir / FAILURE_FILE).unlink()
    outcome.trained.append(run.name)
    if result.get("diverged"):
        outcome.diverged.append(run.name)
        bar.write(f"{run.name}: diverged at step {result.get('diverged_at_step')}")
        return "diverged"
    loss = result.get("final_val_loss")
    tps = result.get("tokens_per_sec")
    bar.write(f"{run.name}: done  val_loss {_fmt(loss, '.4f')}  "
              f"{_fmt(tps, ',.0f')} tok/s  {time.time() - start:.0f} s")
    return "done"


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _say(log: Callable[[str], None] | None, text: str) -> None:
    (log or (lambda s: print(s, file=sys.stderr)))(text)


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix_str(self, s: str) -> None: ...
    def close(self) -> None: ...
    def write(self, s: str) -> None:
        print(s, file=sys.stderr)


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    class _Bar(tqdm):
        def write(self, s: str) -> None:  # type: ignore[override]
            tqdm.write(s, file=sys.stderr)

    return _Bar(total=total, desc="sweep", unit="run", position=0, leave=True, file=sys.stderr,
                dynamic_ncols=True)


__all__ = [
    "FINISHED", "RESULT_COLUMNS", "STATUSES", "Run", "RunLock", "Sweep", "SweepOutcome",
    "atomic_write", "config_changes", "default_runner", "expand", "fmt_lr", "parse_shard",
    "other_runs", "read_row", "recorded_run", "rows_to_csv", "run_name", "run_sweep",
    "write_results",
]
