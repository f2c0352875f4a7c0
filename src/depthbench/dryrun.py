"""What a dry run checks and shows without training (``train --dry-run``,
``sweep --dry-run``, ``sweep --list``, and the launchers through them): the
config, the run's start-up checks, the data against this host's files, the mesh
and batch against the devices, the run directory against its config."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from depthbench.errors import ConfigError


def _data_key(config) -> str:
    """Configs with the same key pass or fail data validation alike."""
    c = config.to_dict()
    return json.dumps([c["data"], c["model"]["vocab_size"], c["train"]["seq_len"],
                       c["train"]["batch_size"]], sort_keys=True, default=str)


def data_problems(configs: Iterable, *, files: bool = True) -> list[str]:
    """One line per distinct problem of the configs' ``data`` sections.
    ``files=True`` also checks this host's files as data preparation does first
    (:func:`~depthbench.data.prepare.check_inputs`); ``files=False`` only what
    holds on any host."""
    from depthbench.data.prepare import check_inputs
    from depthbench.data.validate import validate_config

    seen, problems = set(), []
    for config in configs:
        key = _data_key(config)
        if key in seen:
            continue
        seen.add(key)
        try:
            if files:
                check_inputs(config)  # what the run's data preparation checks first
            else:
                validate_config(config, files=False)
        except ConfigError as e:
            if str(e) not in problems:
                problems.append(str(e))
    return problems


def startup_problems(configs: Iterable) -> list[str]:
    """One line per distinct problem the runs' own start-up checks find on this
    host (:mod:`depthbench.train.preflight`: W&B, the data cache, the launch
    environment): cheap, so a sweep runs them for all its runs before its first."""
    from depthbench.train import preflight

    problems: list[str] = []
    for config in configs:
        try:
            preflight.check_config(config)
        except ConfigError as e:
            if str(e) not in problems:
                problems.append(str(e))
    return problems


def run_problems(configs: Iterable) -> list[str]:
    """Every problem a run of these configs would meet on this host before its
    first step: its data (:func:`data_problems`) and :func:`startup_problems`."""
    configs = list(configs)
    problems = data_problems(configs)
    return problems + [p for p in startup_problems(configs) if p not in problems]


def check_startup(configs: Iterable) -> None:
    """Raise the first of :func:`startup_problems` as a ConfigError (exit status 2)."""
    _raise_first(startup_problems(configs))


def check_data(configs: Iterable, *, files: bool = True) -> None:
    """Raise the first data problem as a ConfigError (exit status 2)."""
    _raise_first(data_problems(configs, files=files))


def _raise_first(problems: list[str]) -> None:
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(problems[0] + more)


def _count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}"


def _data_line(config) -> str:
    from depthbench.data import corpora

    d = config.data
    if d.corpus == "micro":
        where = "the bundled micro corpus (Wikipedia summaries + Shakespeare)"
    else:
        files = corpora.resolve_paths(d.paths)
        size = sum(f.stat().st_size for f in files)
        where = f"{len(files)} file(s), {size / 1e6:.3g} MB, from {d.paths}"
    tok = d.tokenizer or f"SentencePiece BPE trained on the training split ({d.val_fraction:g} " \
                         "held out)"
    return f"{d.corpus}: {where}; tokenizer: {tok}"


def _workdir_line(config, workdir: Path) -> str:
    from depthbench import run_identity as identity
    from depthbench.rundir import restore
    from depthbench.rundir.names import CHECKPOINT_DIR

    done = identity.check_run_dir(config, workdir)  # raises if it holds another config
    if done is not None:
        return f"{workdir}: holds this run, finished (not retrained)"
    # What the trainer would resume from (checked, not read; none intact: its error).
    found = restore.newest_intact(workdir / CHECKPOINT_DIR,
                                  hint="move that directory away to start the run over")
    if found is not None:
        skipped = f" (skipping damaged {found.skipped_text()})" if found.skipped else ""
        return f"{workdir}: holds this run; resumes from step {found.step}{skipped}"
    return f"{workdir}: new run" if not workdir.exists() else f"{workdir}: starts here"


def describe_train(config, workdir: str | Path) -> list[tuple[str, str]]:
    """(label, value) rows of what ``train`` would do; raises ConfigError on any
    problem the run would meet before its first step."""
    from depthbench import costs, parallel
    from depthbench.model.spec import ModelSpec
    from depthbench.train import preflight

    workdir = preflight.check_run(config, workdir)  # what train checks first, in its order
    check_data([config])
    spec = ModelSpec.from_config(config)
    s, t = spec.shape, config.train
    mesh = parallel.mesh_from_config(config)
    parallel.check_batch(mesh, int(t.batch_size), int(t.microbatches))
    m = parallel.describe(mesh)
    tokens = int(t.steps) * int(t.batch_size) * int(t.seq_len)
    return [
        ("model", f"{spec.family}  L {s.depth}  d_model {s.d_model}  d_ff {s.d_ff}  heads "
                  f"{s.n_heads} (kv {s.n_kv_heads}, head_dim {s.head_dim})  aspect ratio "
                  f"{s.aspect_ratio:.2f}"),
        ("parameters", f"{_count(costs.param_count(spec))} ({costs.param_count(spec):,}; "
                       f"backbone {_count(costs.backbone_params(spec))}, vocab "
                       f"{spec.vocab_size})"),
        ("recipe", f"{t.steps} steps x {t.batch_size} x {t.seq_len} tokens = {_count(tokens)} "
                   f"tokens; lr {float(t.lr):g}, warmup {float(t.warmup_fraction):g}, "
                   f"microbatches {t.microbatches}"),
        ("mesh", "  ".join(f"{k} {v}" for k, v in m["shape"].items())
         + f"  ({m['devices']} x {m['device_kind']}, {m['processes']} process(es))"),
        ("data", _data_line(config)),
        ("workdir", _workdir_line(config, workdir)),
    ]
