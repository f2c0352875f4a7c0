"""``data tokenize``: text files -> fixed-size token shards, in parallel, streaming, resumable.

Each unit (:mod:`depthbench.data.tokenize_inputs`) is tokenised by one worker
into ``DIR/.work/``, its counts written last (a unit with them is never
redone), then the units are concatenated in order into the shards: the output
is byte-identical for any number of workers and kills (docs/DATA.md)."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import queue as queue_lib
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from depthbench import output_paths
from depthbench.data import cache, split, token_cache
from depthbench.data import tokenize_inputs as inputs
from depthbench.data.tokenizer import Tokenizer, open_tokenizer
from depthbench.errors import ConfigError

FORMAT = "depthbench-token-shards"
VERSION = 1
# In every unit's key.  2: text files read by readers.text_documents (newlines
# normalised, surrounding newlines stripped, as data prepare reads them).
UNIT_RULES = 2
MANIFEST = "manifest.json"
WORK = ".work"
SPLITS = ("train", "val")
DTYPES = ("auto", "uint16", "uint32")


@dataclasses.dataclass(frozen=True)
class Options:
    """What determines the output (``workers`` and ``chunk_bytes`` do not)."""

    text_field: str = "text"
    shard_tokens: int = 100_000_000
    val_fraction: float = 0.001
    dtype: str = "auto"
    eos_token: str = ""


def shard_dtype(requested: str, tk: Tokenizer) -> np.dtype:
    """The shards' dtype; one clear error if the vocabulary does not fit it."""
    if requested not in DTYPES:
        raise ConfigError(f"--dtype: {requested!r} is not one of {', '.join(DTYPES)}")
    if requested == "auto":
        return token_cache.token_dtype(tk.vocab_size)
    dtype = np.dtype(requested)
    if tk.vocab_size - 1 > np.iinfo(dtype).max:
        raise ConfigError(f"--dtype: {dtype.name} holds ids up to {np.iinfo(dtype).max}, but "
                          f"{tk.path} has {tk.vocab_size} tokens; use uint32 (or auto)")
    return dtype


def check_options(opts: Options) -> None:
    if opts.shard_tokens < 1:
        raise ConfigError(f"--shard-tokens: must be a positive integer, got {opts.shard_tokens}")
    if not 0.0 <= opts.val_fraction < 1.0:
        raise ConfigError(f"--val-fraction: must be in [0, 1), got {opts.val_fraction}")
    if not opts.text_field:
        raise ConfigError("--text-field: empty; name the field holding each document")


_WORKER: dict = {}


def _init_worker(tokenizer: Tokenizer, settings: dict, progress_queue) -> None:
    # A forked worker inherits the parent's Python signal handlers (a sweep's
    # SIGTERM -> SystemExit, the trainer's preemption flag); the pool's terminate()
    # must end it, and Ctrl-C is the parent's to handle.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker: scaling is by workers
    os.environ["RAYON_NUM_THREADS"] = "1"
    _WORKER.update(tokenizer=tokenizer, progress=progress_queue, **settings)


def _run_unit(job: tuple[int, inputs.Unit, str]) -> dict:
    """Tokenise one unit into ``<stem>.{train,val}.npy`` + ``<stem>.json`` (the done marker)."""
    index, unit, stem = job
    w = _WORKER
    try:
        return _tokenise_unit(index, unit, Path(stem), w["tokenizer"], w["dtype"], w["eos_id"],
                              w["text_field"], w["val_fraction"], w["progress"])
    except ConfigError as e:
        return {"index": index, "error": str(e)}


def _tokenise_unit(index, unit, stem: Path, tk, dtype, eos_id, field, fraction, progress) -> dict:
    counts = {"documents": [0, 0], "tokens": [0, 0]}  # [train, val]
    eos = np.array([eos_id], dtype=np.uint32)
    with (token_cache.TokenWriter(f"{stem}.train.npy", dtype) as train_w,
          token_cache.TokenWriter(f"{stem}.val.npy", dtype) as val_w):
        writers = (train_w, val_w)
        for texts, nbytes in inputs.documents(unit, field):
            pieces: tuple[list, list] = ([], [])
            for ids in tk.encode_batch(texts, num_threads=1) if texts else []:
                if not ids:
                    continue
                doc = np.asarray(ids, dtype=np.uint32)
                side = int(fraction > 0 and split.is_validation(doc, fraction))
                pieces[side].extend((doc, eos))
                counts["documents"][side] += 1
            for side, parts in enumerate(pieces):
                if parts:
                    writers[side].write(np.concatenate(parts))
            if progress is not None:
                progress.put((nbytes, sum(len(p) for side in pieces for p in side)))
        counts["tokens"] = [train_w.count, val_w.count]
    result = {"index": index, "stem": stem.name, "unit": dataclasses.asdict(unit), **counts}
    cache.write_json(Path(f"{stem}.json"), result)  # atomic: written last, it marks the unit done
    return result


def _unit_stem(work: Path, unit: inputs.Unit, settings_key: str) -> Path:
    key = cache.digest(VERSION, UNIT_RULES, settings_key, inputs.fingerprint(unit.path),
                       unit.kind, unit.start, unit.stop)
    return work / key


def _check_out(out: Path, plan_key: str, command_key: str) -> bool:
    """Refuse an ``--out`` holding something else (nothing there is touched).

    True when ``out`` holds an unfinished run of the same command whose input
    files have changed since (a bad file, fixed): it resumes (units are keyed
    by their own file), but shards an interrupted merge left are stale."""
    cache.usable_dir(out, "--out")
    plan = out / WORK / "plan.json"
    if (out / MANIFEST).is_file():
        previous = _read_record(out / MANIFEST, out)
    elif plan.is_file():
        previous = _read_record(plan, out)
        if previous.get("plan_key") != plan_key and previous.get("command_key") == command_key:
            return True
    elif out.is_dir() and any(p.name != WORK for p in out.iterdir()):
        raise ConfigError(f"--out: {out} is not empty and holds no data tokenize output; "
                          "give a new or empty directory")
    else:
        return False
    if previous.get("plan_key") != plan_key:
        raise ConfigError(f"--out: {out} holds a tokenisation with other inputs or options; "
                          "give a new directory (or delete it to start over)")
    return False


def _read_record(path: Path, out: Path) -> dict:
    try:
        record = cache.read_json(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"--out: {path} is unreadable ({type(e).__name__}); give a new "
                          f"directory (or delete {out} to start over)") from None
    return record if isinstance(record, dict) else {}


def run(input_glob: str, tokenizer_path: str, out: str | Path, opts: Options = Options(), *,
        workers: int = 1, chunk_bytes: int = inputs.CHUNK_BYTES, progress: bool = True,
        log: Callable[[str], None] = print,
        on_unit_done: Callable[[dict], None] | None = None) -> dict:
    """Tokenise ``input_glob`` into shards under ``out``; returns the manifest.

    Bad input found before any tokenising (options, files, tokenizer, the
    start of every file) leaves ``out`` as it was.  A bad document found later
    keeps the units already finished for a re-run to resume; with none
    finished, what this call created is removed again.  ``on_unit_done(result)``
    is called in this process after each unit is recorded as done (the tests
    kill the process there).
    """
    check_options(opts)
    if workers < 1:
        raise ConfigError(f"--workers: must be a positive integer, got {workers}")
    out = output_paths.resolve(out, "--out")
    files = inputs.input_files(input_glob)
    tk = open_tokenizer(tokenizer_path, field="--tokenizer", eos_token=opts.eos_token)
    if tk.eos_id < 0:
        raise ConfigError(f"--tokenizer: {tk.path} has no EOS piece")
    dtype = shard_dtype(opts.dtype, tk)
    settings = {"dtype": dtype.name, "eos_id": tk.eos_id, "text_field": opts.text_field,
                "val_fraction": opts.val_fraction}
    if tk.adds_specials_by_default:
        # Output written under the library's default encode (with these specials)
        # has another key, so it is never resumed into or taken as finished.
        settings["special_tokens"] = "none added"
    settings_key = cache.digest(FORMAT, VERSION, tk.sha256, settings)
    sources = [inputs.fingerprint(str(f)) for f in files]
    plan_key = cache.digest(settings_key, opts.shard_tokens, sources)
    command_key = cache.digest(settings_key, opts.shard_tokens, [s[0] for s in sources])
    inputs_changed = _check_out(out, plan_key, command_key)
    if (out / MANIFEST).is_file():
        log(f"{out} already holds this tokenisation ({MANIFEST}); nothing to do")
        return cache.read_json(out / MANIFEST)
    units = inputs.plan_units(files, opts.text_field, chunk_bytes)
    inputs.preflight(units, opts.text_field)
    created = _first_missing(out)
    work = out / WORK
    work.mkdir(parents=True, exist_ok=True)
    cache.write_json(work / "plan.json", {"plan_key": plan_key, "command_key": command_key})
    for stale in work.glob(".*.tmp-*"):  # writers killed mid-unit
        stale.unlink(missing_ok=True)
    for stale in _shard_files(out) if inputs_changed else ():  # a merge of the old inputs
        stale.unlink()
    stems = [_unit_stem(work, u, settings_key) for u in units]
    done = {i: cache.read_json(Path(f"{s}.json")) for i, s in enumerate(stems)
            if Path(f"{s}.json").is_file()}
    todo = [(i, units[i], str(stems[i])) for i in range(len(units)) if i not in done]
    log(f"tokenising {len(files)} file(s) in {len(units)} unit(s) with {Path(tk.path).name} "
        f"({tk.kind}, vocab {tk.vocab_size}, EOS {tk.token_text(tk.eos_id)!r} = {tk.eos_id}) "
        f"into {out} [{dtype.name}, {opts.shard_tokens:,} tokens per shard, "
        f"{workers} worker(s)]")
    if done:
        log(f"resuming: {len(done)} of {len(units)} unit(s) already done")
    t0 = time.perf_counter()
    try:
        new_tokens = _run_units(todo, tk, {**settings, "dtype": dtype}, workers, progress,
                                sum(u.weight for u in units), sum(units[i].weight for i in done),
                                done, on_unit_done)
        results = [done[i] for i in range(len(units))]
        if not any(sum(r["documents"]) for r in results):
            done.clear()  # nothing worth keeping
            raise inputs.no_documents(len(files))
    except ConfigError as e:
        raise _failed(e, out, work, created, len(done)) from None
    seconds = time.perf_counter() - t0
    manifest = _assemble(out, results, dtype, opts, progress)
    manifest.update(
        format=FORMAT, version=VERSION, plan_key=plan_key, tokenizer=tk.record(),
        dtype=dtype.name, eos_id=tk.eos_id, shard_tokens=opts.shard_tokens,
        val_fraction=opts.val_fraction, text_field=opts.text_field,
        sources=_per_source(sources, results))
    cache.write_json(out / MANIFEST, manifest)
    _remove_work(work)
    rate = f", {new_tokens / seconds / 1e6:.2f}M tokens/s" if seconds > 0 and new_tokens else ""
    log(f"wrote {manifest['splits']['train']['tokens']:,} training and "
        f"{manifest['splits']['val']['tokens']:,} validation tokens to {out} "
        f"({seconds:.1f}s tokenising{rate})")
    return manifest


def _first_missing(out: Path) -> Path | None:
    """The outermost of ``out`` and its parents that does not exist yet (None: ``out`` does)."""
    missing = None
    for p in (out, *out.parents):
        if p.exists():
            break
        missing = p
    return missing


def _failed(error: ConfigError, out: Path, work: Path, created: Path | None,
            finished: int) -> ConfigError:
    """The error to report when tokenising stopped on bad input.  Finished units
    are kept for a re-run; with none, what this run created is removed."""
    if finished:
        return ConfigError(f"{error}; the {finished} unit(s) finished are kept in {work}: fix "
                           "the input and re-run the same command to resume")
    _remove_work(work)
    if created is not None:
        for p in (out, *out.parents):
            if p.exists() and not any(p.iterdir()):
                p.rmdir()
            if p == created:
                break
    return error


def _run_units(todo, tk, settings, workers, progress, total_weight, done_weight, done,
               on_unit_done) -> int:
    """Run the units on ``workers`` processes; fill ``done``; return the tokens written."""
    if not todo:
        return 0
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                      else "spawn")
    progress_queue = ctx.Queue()
    pool = ctx.Pool(min(workers, len(todo)), initializer=_init_worker,
                    initargs=(tk, settings, progress_queue))
    bar = tqdm(total=total_weight, initial=done_weight, unit="B", unit_scale=True,
               desc="tokenising", disable=not progress, dynamic_ncols=True)
    tokens, t0, reported = 0, time.perf_counter(), {}
    try:
        pending = {job[0]: pool.apply_async(_run_unit, (job,)) for job in todo}
        while pending:
            try:
                while True:
                    nbytes, ntok = progress_queue.get(timeout=0.1)
                    tokens += ntok
                    bar.update(nbytes)
            except queue_lib.Empty:
                pass
            for index in [i for i, r in pending.items() if r.ready()]:
                result = pending.pop(index).get()
                if "error" in result:
                    raise ConfigError(result["error"])
                done[index] = result
                reported[index] = True
                if on_unit_done is not None:
                    on_unit_done(result)
            elapsed = time.perf_counter() - t0
            bar.set_postfix_str(f"{tokens / max(elapsed, 1e-9) / 1e6:.2f}M tok/s", refresh=False)
        bar.update(max(0, total_weight - bar.n))
        pool.close()
    finally:
        pool.terminate()
        pool.join()
        bar.close()
    # Count exactly (the queue carries the same numbers, but may lag the results).
    return sum(done[i]["tokens"][0] + done[i]["tokens"][1] for i in reported)


def _assemble(out: Path, results: list[dict], dtype: np.dtype, opts: Options,
              progress: bool) -> dict:
    """Cut each split's unit arrays, in unit order, into shards of ``shard_tokens``."""
    splits = {}
    work = out / WORK
    for side, name in enumerate(SPLITS):
        sizes = [r["tokens"][side] for r in results]
        total, k = sum(sizes), opts.shard_tokens
        ends = np.cumsum(sizes)
        shards = []
        bar = tqdm(total=total, unit="tok", unit_scale=True, desc=f"writing {name} shards",
                   disable=not progress or total == 0, leave=False)
        for s in range(-(-total // k)):
            lo, hi = s * k, min(total, (s + 1) * k)
            path = out / f"{name}_{s:05d}.npy"
            shards.append({"file": path.name, "tokens": hi - lo})
            if not _complete(path, hi - lo, dtype):
                with token_cache.TokenWriter(path, dtype) as w:
                    for u in np.flatnonzero((ends > lo) & (ends - np.asarray(sizes) < hi)):
                        start = int(ends[u] - sizes[u])
                        arr = token_cache.open_tokens(_unit_path(results[u], work, name),
                                                      field="--out")
                        w.write(arr[max(lo, start) - start: min(hi, int(ends[u])) - start])
            # Units wholly inside finished shards are no longer needed.
            for u in np.flatnonzero(ends <= hi):
                _unit_path(results[u], work, name).unlink(missing_ok=True)
            bar.update(hi - lo)
        bar.close()
        docs = sum(r["documents"][side] for r in results)
        splits[name] = {"documents": docs, "tokens": total, "shards": shards}
    return {"splits": splits}


def _shard_files(out: Path) -> list[Path]:
    return [p for name in SPLITS for p in out.glob(f"{name}_[0-9][0-9][0-9][0-9][0-9].npy")]


def _unit_path(result: dict, work: Path, split_name: str) -> Path:
    return work / f"{result['stem']}.{split_name}.npy"


def _complete(path: Path, n: int, dtype: np.dtype) -> bool:
    if not path.is_file():
        return False
    try:
        arr = token_cache.open_tokens(path, field="--out", dtype=dtype)
    except ConfigError:
        return False
    return len(arr) == n


def _per_source(sources: list, results: list[dict]) -> list[dict]:
    by_path = {s[0]: {"path": s[0], "bytes": s[1], "documents": 0, "train_tokens": 0,
                      "val_tokens": 0} for s in sources}
    for r in results:
        entry = by_path[os.path.abspath(r["unit"]["path"])]
        entry["documents"] += sum(r["documents"])
        entry["train_tokens"] += r["tokens"][0]
        entry["val_tokens"] += r["tokens"][1]
    return list(by_path.values())


def _remove_work(work: Path) -> None:
    for f in work.iterdir():
        f.unlink(missing_ok=True)
    work.rmdir()


def load_manifest(out: str | Path) -> dict:
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise ConfigError(f"--out: {out} has no {MANIFEST} (tokenisation not finished)")
    return json.loads(path.read_text())
