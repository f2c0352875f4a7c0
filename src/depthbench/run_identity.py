"""A run's identity: the fields of its config that say what it computes.

A run directory may be resumed, and a finished run skipped, only by a config
with the same identity: every field but the runtime ones
(:data:`RUNTIME_FIELDS`, the one hand-kept list), ``resolved.*``, other
families' ``model.residual`` fields and a pretraining run's ``finetune.*``
(docs/CONFIG.md, "Which config resumes a run")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_collections

from depthbench.config import base_config, flatten, from_saved
from depthbench.errors import ConfigError
from depthbench.model.residual.protocol import registry
from depthbench.rundir import io
from depthbench.rundir.names import CHECKPOINT_DIR, CONFIG_FILE, RESULT_FILE

# Fields that say how a run executes, not what it computes: a run may resume
# with other values (another mesh after a preemption, another cache).  A
# trailing "." names a whole section.
RUNTIME_FIELDS = (
    "parallel.",
    "eval.",  # downstream evaluation after a sweep's run (depthbench.evaluation)
    "data.cache_dir",
    "data.prefetch",
    "data.worker_count",
    "train.keep_checkpoints",
    "train.checkpoint_every",
    "train.log_every",
    "train.eval_every",
    "train.layer_stats_every",
    "train.wandb",  # a second metrics sink (train/wandb_sink.py)
    "analysis.",
)

_RESIDUAL = "model.residual."
_FINETUNE = "finetune."


def is_runtime_field(dotted: str) -> bool:
    return any(dotted == f or (f.endswith(".") and dotted.startswith(f)) for f in RUNTIME_FIELDS)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def identity(saved: dict) -> dict[str, Any]:
    """The identity fields of ``saved``, flattened.  A field missing from ``saved``
    takes its default, so old run directories keep their identity; other
    families' residual fields (which old run directories hold) are no part of it,
    so changing one family's default never touches another family's runs."""
    flat = flatten(from_saved(saved))
    defaults = flatten(base_config().to_dict())
    family = flat.get("model.family", defaults.get("model.family"))
    own = registry.get(family).config_fields() if family in registry.names() else {}
    out: dict[str, Any] = {}
    pretraining = not flat.get(_FINETUNE + "parent")
    for key in set(flat) | set(defaults):
        if is_runtime_field(key) or key.startswith("resolved.") or key.startswith(_RESIDUAL):
            continue
        if pretraining and key.startswith(_FINETUNE):
            continue
        out[key] = _hashable(flat.get(key, defaults.get(key)))
    for name, default in own.items():
        out[_RESIDUAL + name] = _hashable(flat.get(_RESIDUAL + name, default))
    out.update(_shape_identity(saved))
    return out


# Fields that only choose the model's shape: the identity holds the shape they
# resolve to instead, so a run whose config.json states its shape outright
# (run.open_run's complete config, a fine-tuning's copy of its parent's) is the
# same run as the spec that named the suite's row.
_SHAPE_CHOICE = ("model.suite", "model.budget", "model.fix")
_SHAPE_FIELDS = ("model.depth", "model.d_model", "model.d_ff", "model.n_heads",
                 "model.n_kv_heads")


def _shape_identity(saved: dict) -> dict[str, Any]:
    """The resolved shape as identity fields (the choosing fields neutral); nothing
    if the config does not resolve (its fields then speak for themselves)."""
    from depthbench.shapes import resolve_shape

    try:
        shape = resolve_shape(saved_config(saved))
    except (ConfigError, TypeError, ValueError, AttributeError):
        return {}
    return {**{key: None for key in _SHAPE_CHOICE},
            **{key: getattr(shape, key.split(".", 1)[1]) for key in _SHAPE_FIELDS}}


def config_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(field, old, new) for every field of the runs' :func:`identity` whose
    value differs, sorted by field (``model.family`` before its fields)."""
    a, b = identity(old), identity(new)
    return [(key, a.get(key), b.get(key)) for key in sorted(set(a) | set(b))
            if a.get(key) != b.get(key)]


def saved_config(saved: dict) -> ml_collections.ConfigDict:
    """A config as a run saved it, fields added to the schema since then taking
    their defaults (what :func:`config_changes` assumes too), so code reading
    an old run's config finds every field."""

    def merge(defaults: dict, given: dict, where: str) -> dict:
        out = dict(defaults)
        for key, value in given.items():
            both = isinstance(value, dict) and isinstance(defaults.get(key), dict)
            if not both and key in defaults and where != "model.residual.":
                _check_type(where + str(key), defaults[key], value)
            out[key] = merge(defaults[key], value, f"{where}{key}.") if both else value
        return out

    return ml_collections.ConfigDict(merge(base_config().to_dict(), from_saved(saved), ""))


def _check_type(field: str, default: Any, value: Any) -> None:
    """ConfigError unless a saved ``value`` has the type of the schema's ``default``
    (an int where a float is asked is one; a bool is neither).  A run directory
    may come from anyone: a field of another type is one line, not a traceback
    deep inside a reader.  A family's own fields are its config's to check."""
    if default is None or value is None:
        return
    kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,), list: (list,),
             tuple: (list, tuple), dict: (dict,)}
    want = kinds.get(type(default))
    if want is None:
        return
    if isinstance(value, bool) != (bool in want) or not isinstance(value, want):
        raise ConfigError(f"{CONFIG_FILE}: {field}: expected {type(default).__name__}, got "
                          f"{type(value).__name__} {str(value)[:40]!r}")


def check_run_dir(config, workdir: Path) -> dict | None:
    """Raise ConfigError if ``workdir`` holds a different run; return its
    ``result.json`` if the same run already ended there (None otherwise)."""
    cfg_path = workdir / CONFIG_FILE
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"--workdir: {str(workdir)!r} exists and is not a directory")
    if not cfg_path.exists():
        if (workdir / RESULT_FILE).exists() or (workdir / CHECKPOINT_DIR).exists():
            raise ConfigError(f"--workdir: {str(workdir)!r} holds a run without {CONFIG_FILE}; "
                              "use an empty or new directory")
        return None
    try:
        saved = io.read_json(cfg_path)
    except io.DamagedFile as e:
        raise ConfigError(f"--workdir: {cfg_path} is unreadable ({e.reason}); use a new "
                          "directory") from None
    changes = config_changes(saved, config.to_dict())
    if changes:
        key, old, new = changes[0]
        raise ConfigError(f"config.{key}: {str(workdir)!r} holds a run with {key}={old!r}, not "
                          f"{new!r}; use the same config to resume it or a new --workdir")
    try:
        return io.read_json(workdir / RESULT_FILE)
    except io.DamagedFile as e:
        raise ConfigError(f"--workdir: {e.path} is unreadable ({e.reason}); delete it to "
                          "finish the run again from its last checkpoint") from None
