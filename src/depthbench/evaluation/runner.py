"""Evaluate one run directory on a suite; write ``RUN_DIR/eval/<suite>.json``.

``nll-code-stem-math`` runs here (:mod:`depthbench.evaluation.nll_suite`, no
lm-eval needed); ``commonsense``, ``bbh-reasoning`` and ``--tasks`` run
``lm_eval.simple_evaluate`` on the ``depthbench`` backend with each task's own
settings.  The suites: docs/EVAL.md."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from depthbench.errors import ConfigError
from depthbench.evaluation.prefix import prefix_token_id
from depthbench.rundir.io import atomic_write_json, json_safe, read_json
from depthbench.rundir.names import EVAL_DIR

COMMONSENSE = ("openbookqa", "winogrande", "arc_challenge", "arc_easy", "hellaswag",
               "social_iqa", "piqa")
BBH_REASONING = tuple(f"bbh_zeroshot_{t}" for t in (
    "tracking_shuffled_objects_three_objects", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects", "logical_deduction_three_objects",
    "logical_deduction_five_objects", "logical_deduction_seven_objects",
    "boolean_expressions", "multistep_arithmetic_two", "web_of_lies", "navigate"))
LM_EVAL_SUITES = {"commonsense": COMMONSENSE, "bbh-reasoning": BBH_REASONING}
NLL_SUITE = "nll-code-stem-math"
SUITES = (NLL_SUITE, *LM_EVAL_SUITES)


def run_meta(run) -> dict[str, Any]:
    s = run.spec
    return {"run_dir": str(run.run_dir), "step": run.step, "family": s.family, "depth": s.depth,
            "d_model": s.d_model, "aspect_ratio": round(s.d_model / s.depth, 4),
            "name": str(run.config.get("name", ""))}


def nll_suite(run, scorer, *, tasks=None, data_dir=None, limit=None) -> dict[str, Any]:
    from depthbench.evaluation import nll_suite as suite
    from depthbench.evaluation import records

    names = list(tasks or suite.TASKS)
    unknown = [t for t in names if t not in suite.TASKS]
    if unknown:
        raise ConfigError(f"--only: {unknown[0]!r} is not a task of {NLL_SUITE}; allowed: "
                          f"{', '.join(suite.TASKS)}")
    tok = run.tokenizer
    prefix = prefix_token_id(tok)
    loaded = {}
    for name in names:  # load everything first: a missing file fails before any scoring
        t = suite.TASKS[name]
        docs, source = records.load(name, hf_path=t.hf_path, hf_name=t.hf_name, split=t.split,
                                    data_dir=data_dir, limit=limit)
        loaded[name] = (suite.examples(t, docs, source), source)
    results = {name: suite.score_task(scorer, tok, prefix, suite.TASKS[name], pairs, source)
               for name, (pairs, source) in loaded.items()}
    categories, overall = suite.aggregate(results)
    return {"tasks": results, "categories": categories, "aggregate": overall}


# lm-eval reads a name with one of these as an fnmatch pattern over its task names.
_PATTERN_CHARACTERS = frozenset("*?[")


def resolve_tasks(tasks, include_path=None) -> tuple[Any, list[str]]:
    """``(local, unknown)`` for ``tasks``, from one lm-eval index of ``include_path``
    alone (small), never from lm-eval's ~15,000 built-in task files (8-20 s on a
    2-core machine).

    ``local``: that index's ``TaskManager`` when every one of ``tasks`` is a task
    (not a group or a tag, which may name built-in tasks) defined there, else
    None.  A task under ``include_path`` takes precedence over a built-in one of
    the same name, so then the built-in ones cannot change what is evaluated.

    ``unknown``: those of ``tasks`` that are surely no task, group or tag.  Every
    name in lm-eval's index is the value of a ``task``, ``group`` or ``tag``
    field of a YAML file it walks (``lm_eval.tasks._index.TaskIndex``: its own
    task folder, then ``include_path``) or of a file such a file includes (any
    name: ``include: _gen_yaml_2shot``), and its built-in files include only
    files of its task folder (:func:`builtin_task_files`).  So a name that no
    file there contains as text, and that the index of ``include_path`` lacks
    (it follows includes wherever they point), is in no index.  A pattern
    (``*``, ``?``, ``[``), a ``.yaml`` file or an existing path is never
    reported: lm-eval resolves those itself.  The converse does not hold (a
    name found as text may still be unknown), so an empty list means: ask
    lm-eval's full index.  ``depthbench eval`` and ``depthbench lm-eval`` both
    use it."""
    local_index = {}
    if include_path:
        from lm_eval.tasks import TaskManager
        from lm_eval.tasks._index import Kind

        manager = TaskManager(include_path=str(include_path), include_defaults=False)
        local_index = manager.task_index
        if tasks and all(t in local_index and local_index[t].kind in (Kind.TASK, Kind.PY_TASK)
                         for t in tasks):
            return manager, []
    names = [t for t in dict.fromkeys(tasks) if t and not _PATTERN_CHARACTERS & set(t)
             and not t.endswith(".yaml") and not Path(t).exists() and t not in local_index]
    left = {t: t.encode() for t in names}
    for path in builtin_task_files() if left else ():
        text = path.read_bytes()
        left = {t: raw for t, raw in left.items() if raw not in text}
        if not left:
            break
    return None, list(left)


def builtin_task_files() -> list[Path]:
    """Every file of lm-eval's built-in task folder (its YAML files and what they
    include; its ``__pycache__`` aside): about 15,500 files, 12 MB."""
    import lm_eval.tasks

    root = Path(lm_eval.tasks.__file__).parent
    return [p for p in root.rglob("*") if "__pycache__" not in p.parts and p.is_file()]


def lm_eval_suite(lm, tasks, *, include_path=None, limit=None, num_fewshot=None
                  ) -> dict[str, Any]:
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ConfigError("--suite/--tasks: lm-eval is not installed; pip install "
                          "'depthbench[eval]'") from None
    manager, missing = resolve_tasks(tasks, include_path)  # the built-in index where needed
    if manager is None and not missing:
        manager = TaskManager(include_path=str(include_path) if include_path else None)
        missing = [t for t in tasks if t not in manager.all_tasks]
    if missing:
        raise ConfigError(f"--tasks: {missing[0]!r} is not an lm-eval task"
                          f"{' (nor in --include-path)' if include_path else ''}")
    try:
        out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), num_fewshot=num_fewshot,
                                      limit=limit, task_manager=manager, log_samples=False,
                                      batch_size=lm.batch_size)
    except ConnectionError as e:  # datasets' "Couldn't reach '...' on the Hub"
        raise ConfigError(f"--tasks: {str(e).splitlines()[0][:160]}; run where the hub is "
                          "reachable, or define the tasks with local data files and pass "
                          "--include-path") from None
    results = {task: {k: v for k, v in metrics.items() if k != "alias"}
               for task, metrics in out.get("results", {}).items()}
    return {"tasks": results, "n_samples": out.get("n-samples", {}),
            "versions": out.get("versions", {}), "lm_eval_version": lm_eval.__version__}


def evaluate(run_dir: str | Path, *, suite: str | None = None, tasks: list[str] | None = None,
             name: str | None = None, data_dir: str | Path | None = None,
             include_path: str | Path | None = None, limit: int | None = None,
             batch_size: int = 8, max_length: int | None = None, step: int | None = None,
             num_fewshot: int | None = None, only: list[str] | None = None,
             progress: bool = True) -> tuple[dict, Path]:
    """Evaluate ``run_dir``; return (the result dict, the JSON path written)."""
    from depthbench.evaluation.scoring import Scorer
    from depthbench.run import load_run

    if (suite is None) == (not tasks):
        raise ConfigError(f"eval: give exactly one of --suite ({', '.join(SUITES)}) or --tasks")
    if suite is not None and suite not in SUITES:
        raise ConfigError(f"--suite: {suite!r} is unknown; allowed: {', '.join(SUITES)}")
    if only and suite != NLL_SUITE:
        raise ConfigError(f"--only: picks tasks of --suite {NLL_SUITE}; use --tasks for lm-eval")
    # Options of the other kind of suite would be ignored without a word: refuse them.
    lm_eval_only = {"--include-path": include_path, "--num-fewshot": num_fewshot}
    nll_only = {"--data-dir": data_dir}
    for flag, value in (lm_eval_only if suite == NLL_SUITE else nll_only).items():
        if value is not None:
            which = ("the lm-eval suites and --tasks" if flag in lm_eval_only
                     else f"--suite {NLL_SUITE}")
            raise ConfigError(f"{flag}: applies only to {which}")
    if data_dir and not Path(data_dir).expanduser().is_dir():
        raise ConfigError(f"--data-dir: {str(data_dir)!r} is not a directory")
    if include_path and not Path(include_path).expanduser().exists():
        raise ConfigError(f"--include-path: {str(include_path)!r} does not exist")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit: must be >= 1, got {limit}")
    start = time.time()
    run = load_run(run_dir, step=step)
    if suite == NLL_SUITE:
        scorer = Scorer(run, batch_size=batch_size, max_length=max_length, progress=progress)
        body = nll_suite(run, scorer, tasks=only, data_dir=data_dir, limit=limit)
        shapes = sorted(scorer.compiled_shapes)
        max_len, bs = scorer.max_length, scorer.batch_size
    else:
        from depthbench.evaluation.lm_backend import DepthbenchLM

        lm = DepthbenchLM(run=run, batch_size=batch_size, max_length=max_length,
                          progress=progress)
        body = lm_eval_suite(lm, LM_EVAL_SUITES.get(suite, tasks), include_path=include_path,
                             limit=limit, num_fewshot=num_fewshot)
        shapes = sorted(lm.scorer.compiled_shapes)
        max_len, bs = lm.scorer.max_length, lm.scorer.batch_size
    label = name or suite or "tasks"
    result = {"suite": label, **run_meta(run), "max_length": max_len, "batch_size": bs,
              "limit": limit, **body, "compiled_shapes": [list(s) for s in shapes],
              "wall_seconds": round(time.time() - start, 3)}
    out_dir = run.run_dir / EVAL_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{label}.json"
    atomic_write_json(path, json_safe(result))
    return read_json(path), path
