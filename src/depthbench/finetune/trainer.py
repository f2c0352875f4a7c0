"""``depthbench finetune``: a plan (:mod:`.plan`) trained by the one trainer
loop into a run directory (docs/FINETUNE.md), with :class:`FinetuneInputs`:
the records' rows and the parent's newest intact parameters, a fresh optimizer
state, step 0.  The parent step read is recorded in
``resolved.finetune.parent_step``."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from depthbench import output_paths
from depthbench.errors import ConfigError
from depthbench.finetune.plan import Plan, RowReader, train_iterator
from depthbench.rundir import io
from depthbench.rundir.names import CONFIG_FILE, METRICS_FILE
from depthbench.rundir.restore import read_params
from depthbench.train import state as state_lib
from depthbench.train.compiled import compiled


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
    from depthbench.train import loop

    path = check_workdir(workdir, plan.parent.path)
    return loop.run(plan.config, path, progress=progress, inputs=FinetuneInputs(plan, path))


class FinetuneInputs:
    """What the trainer loop trains on and starts from (:mod:`depthbench.train.inputs`)."""

    evaluate_first = True

    def __init__(self, plan: Plan, workdir: Path):
        self.plan, self.workdir = plan, Path(workdir)
        self.params = None
        self.parent_step: int | None = None

    @property
    def config(self):
        return self.plan.config

    @property
    def vocab_size(self) -> int:
        return int(self.plan.data.manifest["tokenizer"]["vocab_size"])

    def prepare(self, progress: bool) -> None:
        """The parent step: the one config.json recorded, else its newest intact."""
        saved = io.read_json(self.workdir / CONFIG_FILE) or {}
        step = ((saved.get("resolved") or {}).get("finetune") or {}).get("parent_step")
        if step is None:
            self.params, self.parent_step = self._read(None)
        else:
            self.parent_step = int(step)

    def _read(self, step: int | None):
        s = compiled(self.config)[0]  # memoised: the loop builds the same
        return read_params(self.plan.parent.path, s.abstract_state.params, step)

    def resolved(self) -> dict:
        data = self.plan.data
        return {"tokenizer": self.plan.parent.resolved.get("tokenizer", {}),
                "finetune": {"parent": str(self.plan.parent.path),
                             "parent_step": self.parent_step, "data": str(data.directory),
                             "data_digest": data.digest, "records": data.manifest["splits"],
                             "rows": self.plan.rows.rows}}

    def files(self) -> dict[str, Path]:
        """The parent's tokenizer files, copied beside config.json (a relocatable run)."""
        return self.plan.parent.tokenizer_files()

    def train_iterator(self):
        c = self.config
        reader = RowReader(str(self.plan.data.directory), "train", self.plan.rows,
                           int(c.train.seq_len), self.plan.pad_id,
                           c.finetune.layout == "packed")
        return train_iterator(reader, int(c.train.batch_size), int(c.train.steps),
                              int(c.data.prefetch))

    def val_batches(self) -> list[dict]:
        return self.plan.validation.batches()

    def val_loss(self, losses) -> float:
        return self.plan.validation.loss(losses)

    def initial_state(self, s: state_lib.TrainSetup, seed: int, init_fn):
        params = self.params
        if params is None:  # config.json names the step: read exactly that one
            params, _ = self._read(self.parent_step)
        self.params = None  # the state owns them now (its buffers are donated)

        def start(params, key_data):
            # the run key as a fresh run's: the second half of the seed's split
            _, run_key = jax.random.split(jax.random.wrap_key_data(key_data))
            return state_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                        opt_state=s.tx.init(params),
                                        rng=jax.random.key_data(run_key))

        fn = jax.jit(start, out_shardings=s.state_shardings)
        with s.context():
            return fn(params, jax.random.key_data(jax.random.key(seed)))

    def result_fields(self, workdir: Path) -> dict:
        rows = [r for r in io.read_jsonl(Path(workdir) / METRICS_FILE)
                if r.get("step") == 0 and "val_loss" in r]
        f = self.config.finetune
        return {"finetune": {"parent": f.parent, "parent_step": self.parent_step,
                             "data_digest": f.data_digest, "layout": f.layout,
                             "epochs": float(f.epochs),
                             "initial_val_loss": rows[-1]["val_loss"] if rows else None}}
