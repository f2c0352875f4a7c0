"""A fine-tuning run through the one trainer loop, into a run directory.

:func:`finetune` checks the run directory, then hands the plan
(:mod:`.configure`) to :func:`depthbench.train.loop.run` with the
fine-tuning's inputs (:mod:`.inputs`): the same checkpoints (state, data
position, clock, integrity seals), resume, preemption, divergence and logs
as pretraining.  The result is a run directory like any other (load_run,
analyze, eval, export read it), whose ``config.json`` names its parent
(``finetune.parent``) and its data (``finetune.data_digest``).

A ``--workdir`` that exists, is not empty and holds no run, or holds a run
that is not a fine-tuning of this parent, is refused before anything is
written; one that holds this fine-tuning resumes it (or, finished, is
returned as recorded).
"""

from __future__ import annotations

from pathlib import Path

from depthbench import output_paths
from depthbench.errors import ConfigError
from depthbench.finetune.configure import Plan
from depthbench.rundir import io
from depthbench.rundir.names import CONFIG_FILE


def check_workdir(workdir: str | Path, parent: Path, field: str = "--workdir") -> Path:
    """``workdir`` resolved; one line unless it is new, empty, or this fine-tuning's."""
    path = output_paths.resolve(workdir, field)
    if path == parent:
        raise ConfigError(f"{field}: {str(workdir)!r} is the parent run itself; give a new "
                          "directory")
    if not path.is_dir() or not any(path.iterdir()):
        return path
    if not (path / CONFIG_FILE).is_file():
        raise ConfigError(f"{field}: {str(workdir)!r} exists and is not empty and holds no "
                          "run; give a new or empty directory")
    try:
        saved = io.read_json(path / CONFIG_FILE) or {}
    except io.DamagedFile as e:
        raise ConfigError(f"{field}: {e.path} is unreadable ({e.reason}); use a new "
                          "directory") from None
    if (saved.get("finetune") or {}).get("parent") != str(parent):
        raise ConfigError(f"{field}: {str(workdir)!r} holds another run (not a fine-tuning of "
                          f"{parent}); give a new directory")
    return path


def finetune(plan: Plan, workdir: str | Path, *, progress: bool = True) -> dict:
    """Train ``plan`` in ``workdir`` (resuming it); the loop's result dict."""
    from depthbench.finetune.inputs import FinetuneInputs
    from depthbench.train import loop

    path = check_workdir(workdir, plan.parent.path)
    return loop.run(plan.config, path, progress=progress, inputs=FinetuneInputs(plan, path))
