"""Weights & Biases as an optional second metrics sink beside TensorBoard.

``train.wandb`` (``""``, ``"offline"``, ``"online"``) turns it on; without
the ``wandb`` package asking for it is one line naming the extra, before
anything is written.  The W&B run's name is the run directory's, its group
the sweep's, its id derived from the run directory and config so a resumed
run continues it.  What it holds and how resumes show: docs/WANDB.md."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from depthbench.config import check_wandb_mode
from depthbench.errors import ConfigError
from depthbench.rundir import io
from depthbench.rundir.names import CONFIG_FILE, RUN_RECORD

EXTRA = "pip install 'depthbench[wandb]'"


def mode_of(config) -> str:
    """The config's ``train.wandb``, checked: one of ``config.WANDB_MODES``, and
    the package is installed when it is not "" (ConfigError otherwise, exit 2)."""
    mode = check_wandb_mode(config.train.get("wandb", ""))
    if mode:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError(f"config.train.wandb: {mode!r} needs the wandb package: "
                              f"{EXTRA}") from None
    return mode


def run_id(workdir: Path, saved: dict) -> str:
    """The same id for every session of one run (its directory and config)."""
    text = f"{workdir}\n{json.dumps(saved, sort_keys=True, default=str)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class WandbSink:
    """One run's W&B run: started with the run's config, fed scalars, finished."""

    def __init__(self, mode: str, workdir: Path):
        import wandb

        saved = io.read_json(workdir / CONFIG_FILE) or {}
        group = workdir.parent.name if (workdir / RUN_RECORD).exists() else None
        try:
            self.run = wandb.init(
                mode=mode, dir=str(workdir), project=os.environ.get("WANDB_PROJECT", "depthbench"),
                name=workdir.name, group=group, id=run_id(workdir, saved), resume="allow",
                config=saved,
                # Its own console capture would fight the progress bar and stdout's summary.
                settings=wandb.Settings(console="off", quiet=True))
        except Exception as e:  # a login, network or settings problem: before any step
            raise ConfigError(f"config.train.wandb: {mode!r}: W&B could not start the run "
                              f"({type(e).__name__}: {e})") from e

    def log(self, step: int, scalars: dict[str, Any]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()
