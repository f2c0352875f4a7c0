"""A fine-tuning run's config: the parent's model, a spec's recipe, the data's digest.

The parent run (any family; trained, or made by import-hf or import-olmo)
gives the ``model`` and ``data`` sections: the parameters must fit, and the
records are tokenised by its tokenizer.  Of those, only how the model runs
(:data:`RUNTIME_FIELDS`: the compute dtype (the recipe computes in bf16),
rematerialisation, kernels) and where data is cached come from the
fine-tuning spec and its overrides; an override of any other ``model.*`` or
``data.*`` field is refused.  Everything else (``train``, ``finetune``,
``parallel``, ``eval``) is the spec's (``sft`` by default: the original's
recipe).  Then ``finetune.parent`` names the parent directory,
``finetune.data_digest`` the prepared records' digest, and ``train.steps``
follows from the records, the layout, ``finetune.epochs`` and the batch
(:mod:`.rows`): a run's identity covers all three, so it resumes only on the
same parent and data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import ml_collections

from depthbench import config as config_lib
from depthbench.errors import ConfigError
from depthbench.finetune import rows
from depthbench.finetune.batches import Validation
from depthbench.finetune.prepare import SFTData, prepare_sft
from depthbench.run import RunDir, open_run

WHAT = "finetune"
# model.* and data.* fields a fine-tuning sets itself: how the model runs, not what it is.
RUNTIME_FIELDS = ("model.compute_dtype", "model.remat_policy", "model.attention_impl",
                  "model.impl", "model.scan_unroll", "model.layer_scan", "data.cache_dir",
                  "data.prefetch", "data.worker_count")
# Fields the command derives: an override of them is refused.
DERIVED = ("train.steps", "finetune.parent", "finetune.data_digest")


@dataclasses.dataclass
class Plan:
    """A fine-tuning, ready to run: its config, parent, data, rows and validation."""

    config: ml_collections.ConfigDict
    parent: RunDir
    data: SFTData
    rows: rows.RowPlan
    validation: Validation

    @property
    def pad_id(self) -> int:
        return int(self.data.manifest["tokenizer"]["eos_id"])


def _flat(config: ml_collections.ConfigDict) -> dict:
    return config_lib.flatten(config.to_dict())


def _refuse_parent_fields(spec: str, overrides: Sequence[str]) -> None:
    """An override may not change the parent's model or tokenizer, nor a derived field."""
    plain, changed = _flat(config_lib.load(spec)), _flat(config_lib.load(spec, overrides))
    for key in sorted(set(plain) | set(changed)):
        if plain.get(key) == changed.get(key):
            continue
        if key in DERIVED:
            raise ConfigError(f"--config.{key}: set by depthbench finetune (train.steps follows "
                              "from finetune.epochs and the records)")
        if key.startswith(("model.", "data.")) and key not in RUNTIME_FIELDS:
            raise ConfigError(f"--config.{key}: a fine-tuned run keeps its parent's model and "
                              f"tokenizer; of model.* and data.* only "
                              f"{', '.join(f.split('.', 1)[1] for f in RUNTIME_FIELDS)} may be set")


def from_parent(recipe: ml_collections.ConfigDict, parent: RunDir
                ) -> ml_collections.ConfigDict:
    """``recipe`` with the parent's model and data (but their runtime fields)."""
    out, theirs = recipe.to_dict(), parent.config.to_dict()
    for section in ("model", "data"):
        own = {f.split(".", 1)[1] for f in RUNTIME_FIELDS if f.startswith(section + ".")}
        out[section] = {**theirs[section], **{k: out[section][k] for k in own}}
    out["finetune"]["parent"] = str(parent.path)
    config = config_lib.with_family_fields(ml_collections.ConfigDict(out))
    return config_lib.validate(config)


def _check_packable(config: ml_collections.ConfigDict) -> None:
    """Packed rows keep their records apart only in the backbone's own attention and
    for a family whose state at a token depends on that token alone."""
    from depthbench.model.residual.protocol import registry
    from depthbench.model.residual.protocol.capabilities import PositionState

    m = config.model
    if m.attention_impl != "xla":
        raise ConfigError(f"config.finetune.layout: 'packed' keeps records apart with "
                          f"model.attention_impl 'xla' only, not {m.attention_impl!r}")
    if issubclass(registry.get(m.family), PositionState):
        raise ConfigError(f"config.finetune.layout: 'packed' needs a family whose state "
                          f"carries nothing across positions; {m.family} does (use 'padded')")


def with_data(config: ml_collections.ConfigDict, parent: RunDir, *, progress: bool,
              field: str) -> Plan:
    """The records prepared with the parent's tokenizer, and the steps they make."""
    f, t = config.finetune, config.train
    if f.layout == "packed":
        _check_packable(config)
    data = prepare_sft(f.records, parent.path, max_seq_len=int(f.max_seq_len),
                       max_samples=int(f.max_samples) or None,
                       val_fraction=float(f.val_fraction), seed=int(f.data_seed),
                       cache_dir=str(config.data.cache_dir), progress=progress, field=field,
                       length_field="config.finetune.max_seq_len")
    _, _, offsets = data.split("train")
    plan = rows.plan(offsets, epochs=float(f.epochs), seed=int(t.seed), seq_len=int(t.seq_len),
                     layout=str(f.layout))
    config = ml_collections.ConfigDict(config.to_dict())
    config.finetune.data_digest = data.digest
    config.train.steps = plan.steps(int(t.batch_size))
    validation = Validation(str(data.directory), int(t.seq_len),
                            int(data.manifest["tokenizer"]["eos_id"]),
                            f.layout == "packed", int(t.batch_size))
    return Plan(config_lib.validate(config), parent, data, plan, validation)


def from_command(parent_dir: str | Path, records: str | Path, spec: str = "sft",
                 overrides: Sequence[str] = (), *, progress: bool = True) -> Plan:
    """``depthbench finetune PARENT --records FILE [--config SPEC] [overrides]``."""
    parent = open_run(parent_dir, WHAT)
    _refuse_parent_fields(spec, overrides)
    recipe = config_lib.load(spec, overrides)
    recipe.finetune.records = str(Path(records).expanduser().absolute())
    recipe.finetune.spec = str(spec)
    return with_data(from_parent(recipe, parent), parent, progress=progress, field="--records")


def from_sweep_run(run_config: ml_collections.ConfigDict, run_dir: str | Path, *,
                   progress: bool = True) -> Plan:
    """The fine-tuning a sweep's run asks for: the recipe of its ``finetune.spec``,
    its own ``finetune``, ``parallel`` and ``eval`` sections."""
    parent = open_run(run_dir, WHAT)
    recipe = config_lib.load(str(run_config.finetune.spec))
    for section in ("finetune", "parallel", "eval"):
        recipe[section] = ml_collections.ConfigDict(run_config[section].to_dict())
    recipe.data.cache_dir = run_config.data.cache_dir
    return with_data(from_parent(recipe, parent), parent, progress=progress,
                     field="config.finetune.records")
