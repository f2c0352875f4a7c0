"""Experiment specs: find a spec, load it, apply command-line overrides, validate.

``--config NAME`` is a bundled spec or a spec file; ``configs/base.py`` defines
every field, and ``model.residual`` the chosen family's (docs/CONFIG.md).
Every problem is one :class:`ConfigError` line naming the field.  Nothing here
names a family."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import math
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_collections

from depthbench import shapes
from depthbench.errors import EXIT_BAD_INPUT, ConfigError  # noqa: F401 (re-exported)
from depthbench.formatting import parse_count
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.capabilities import LearningRateRule
from depthbench.model.residual.protocol.family_config import coerce, unknown_field
from depthbench.model.transformer import remat_policy_names

# The bundled specs, found by name as a user's spec file is found by its path:
# to this module they are specs to load, not code it builds on (they import
# from here and from the registry, never the reverse).
SPECS = "depthbench.configs"
FAMILY = "model.family"
RESIDUAL = "model.residual"
# train.lr_rule: "none", or "family": the depth-transfer rule the family declares
# (capabilities.LearningRateRule).  Run directories written before the rule was
# the family's name it by the one family that had one: read as "family".
LR_RULES = ("none", "family")
def _old_lr_rule(value: Any) -> bool:
    """Whether ``train.lr_rule`` is a saved name of the family rule: the name of
    a family with a learning-rate rule (``"completep"``, before ``"family"``)."""
    from depthbench.model.residual.protocol.capabilities import LearningRateRule

    return value in registry.with_capability(LearningRateRule)


def _bundled() -> ModuleType:
    """The package of the bundled specs (``names()``: them, by name)."""
    return importlib.import_module(SPECS)


def spec_path(spec: str | Path) -> Path:
    """The file of a spec given by name (bundled) or by path."""
    path = Path(spec)
    if path.is_file():
        return path
    name = str(spec).removesuffix(".py")
    if name.isidentifier() and name in _bundled().names():
        return _bundled().file_of(name)
    raise ConfigError(f"config: spec file {str(spec)!r} does not exist, and it names none of "
                      f"the bundled specs ({', '.join(_bundled().names())})")


def import_spec(spec: str | Path) -> ModuleType:
    """The module of a spec: a bundled one by name, or a file imported from its path."""
    path = spec_path(spec)
    if path.parent == Path(_bundled().__file__).parent:
        return importlib.import_module(f"{SPECS}.{path.stem}")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    module_spec = importlib.util.spec_from_file_location(
        f"depthbench_spec_{path.stem}_{digest}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as e:  # a broken spec file is bad input, not a crash
        raise ConfigError(f"config: spec file {str(path)!r} failed to load: {e}") from e
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config: spec file {str(path)!r} has no get_config()")
    return module


def sibling(spec_file: str, name: str) -> ModuleType:
    """The spec ``name`` beside ``spec_file``, else the bundled spec of that name
    (so a spec kept anywhere can build on ``quickstart``, ``paper_400m`` ...)."""
    beside = Path(spec_file).with_name(f"{name}.py")
    if beside.is_file() or name not in _bundled().names():
        if not beside.is_file():
            known = ", ".join(_bundled().names())
            raise ConfigError(f"config: sibling({name!r}): no spec {str(beside)!r}, and "
                              f"{name!r} is none of the bundled specs ({known}); give a file "
                              "with depthbench.config.import_spec(PATH)")
        return import_spec(beside)
    return import_spec(name)


def base_spec_path() -> Path:
    """The file of the bundled base spec (``--config base``)."""
    return _bundled().file_of("base")


def base_config() -> ml_collections.ConfigDict:
    """The defaults of every field (a fresh ConfigDict)."""
    return importlib.import_module(f"{SPECS}.base").get_config()


def _parse_value(field: str, text: str, kind: type | None) -> Any:
    """Parse ``text`` into a value of type ``kind`` (the field's declared type, or
    the type of its current value; None: a Python literal, else the text)."""
    if kind is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--config.{field}: expected true or false, got {text!r}")
    if kind is int:
        try:
            value = float(parse_count(text)) if text[-1:] in "kKmMbB" else float(text)
        except (ValueError, IndexError):
            raise ConfigError(f"--config.{field}: expected an integer, got {text!r}") from None
        if value != int(value):
            raise ConfigError(f"--config.{field}: expected an integer, got {text!r}")
        return int(value)
    if kind is float:
        try:
            return float(parse_count(text)) if text[-1:] in "kKmMbB" else float(text)
        except (ValueError, IndexError):
            raise ConfigError(f"--config.{field}: expected a number, got {text!r}") from None
    if kind is str:
        # Without a shell (sweep files, subprocess lists) `suite=''` keeps its
        # quotes; a quoted string means its contents.
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            return text[1:-1]
        return text
    if kind in (list, tuple):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = [v.strip() for v in text.split(",") if v.strip()]
        return kind(value if isinstance(value, (list, tuple)) else [value])
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _lookup(config: ml_collections.ConfigDict, dotted: str) -> tuple[Any, str]:
    node: Any = config
    parts = dotted.split(".")
    for i, key in enumerate(parts[:-1]):
        if not isinstance(node, ml_collections.ConfigDict) or key not in node:
            raise ConfigError(
                f"--config.{dotted}: unknown section {'.'.join(parts[: i + 1])!r}; "
                f"known: {', '.join(sorted(config.keys()))}"
            )
        node = node[key]
    leaf = parts[-1]
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
        known = (
            ", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict) else ""
        )
        raise ConfigError(f"--config.{dotted}: unknown field; known fields here: {known}")
    return node, leaf


def apply_overrides(
    config: ml_collections.ConfigDict, overrides: Iterable[str] | dict[str, Any]
) -> ml_collections.ConfigDict:
    """Apply ``a.b=value`` strings (or a {dotted: value} dict) to a copy of ``config``,
    ``model.family`` first, so that ``model.residual.*`` sets the chosen family's
    fields."""
    config = ml_collections.ConfigDict(config.to_dict())
    items = list(overrides.items() if isinstance(overrides, dict) else map(_split, overrides))
    items.sort(key=lambda item: item[0] != FAMILY)  # stable: the family first
    for dotted, value in items:
        if dotted.startswith(RESIDUAL + "."):
            _set_field(config, dotted, value)
            continue
        node, leaf = _lookup(config, dotted)
        current = node[leaf]
        if isinstance(current, ml_collections.ConfigDict):
            raise ConfigError(f"--config.{dotted}: is a section, not a field")
        if isinstance(value, str):
            value = _parse_value(dotted, value, None if current is None else type(current))
        elif isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif current is not None and type(value) is not type(current):
            allowed = type(current).__name__
            raise ConfigError(f"config.{dotted}: expected {allowed}, got {value!r}")
        if dotted == FAMILY:
            _switch_family(config, value)
        node[leaf] = value
    return with_family_fields(config)


def _switch_family(config: ml_collections.ConfigDict, family: str) -> None:
    """Drop the fields of ``config.model.residual`` that ``family`` does not declare
    (before ``config.model.family`` becomes ``family``), and the shared ones still
    at the old family's default (two families may default a shared field
    differently: hc's and mhc's ``readout``); an unknown family keeps them, for
    :func:`validate` to name it."""
    if family == config.model.family or family not in registry.names():
        return
    own = registry.get(family).config_fields()
    old = (registry.get(config.model.family).config_fields()
           if config.model.family in registry.names() else {})
    kept = {k: v for k, v in config.model.residual.to_dict().items()
            if k in own and not (k in old and v == old[k])}
    config.model.residual = ml_collections.ConfigDict(kept)


def _set_field(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
    """``model.residual.<name> = value``: a field of the chosen family, parsed as (or
    checked against) its declared type."""
    name, family = dotted[len(RESIDUAL) + 1:], config.model.family
    types = registry.get(family).Config.field_types()
    if name not in types:
        raise unknown_field(name, family, types)
    kind = types[name]
    value = _parse_value(dotted, value, kind) if isinstance(value, str) else coerce(
        name, value, kind)
    config.model.residual = ml_collections.ConfigDict(
        {**config.model.residual.to_dict(), name: value})


def with_family_fields(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` with ``model.residual`` completed to the chosen family's fields
    (checked and typed, the missing ones at their defaults); an unknown family
    leaves it as it is, for :func:`validate` to name."""
    family = config.model.family
    if family in registry.names():
        fields = registry.family_config(family, _residual_dict(config)).as_dict()
        config.model.residual = ml_collections.ConfigDict(fields)
    return config


def _residual_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
    residual = config.model.residual
    if not isinstance(residual, ml_collections.ConfigDict):
        raise ConfigError(f"config.{RESIDUAL}: is a section (the family's fields), got "
                          f"{residual!r}")
    return residual.to_dict()


def set_family(config: ml_collections.ConfigDict, family: str,
               **fields: Any) -> ml_collections.ConfigDict:
    """In a spec: ``config.model.family = family`` with these of its fields (the
    others as a switch leaves them: shared ones kept, the rest default);
    ``config`` is changed in place and returned."""
    registry.get(family)
    _switch_family(config, family)
    config.model.family = family
    for name, value in fields.items():
        _set_field(config, f"{RESIDUAL}.{name}", value)
    return with_family_fields(config)


def from_saved(saved: dict) -> dict:
    """A run directory's saved ``config.json`` as this version reads it: of
    ``model.residual`` the saved family's own fields (a field added since takes
    ``FamilyConfig.saved_before``'s value, else its default), ``train.lr_rule`` by
    its current name.  Other keys are kept; ``saved`` is not changed."""
    out = dict(saved)
    model = out.get("model")
    if isinstance(model, dict) and isinstance(model.get("residual"), dict) and (
            model.get("family") in registry.names()):
        own = registry.get(model["family"]).Config.saved_defaults()
        given = model["residual"]
        out["model"] = {**model, "residual": {k: given.get(k, v) for k, v in own.items()}}
    train = out.get("train")
    if isinstance(train, dict) and _old_lr_rule(train.get("lr_rule")):
        out["train"] = {**train, "lr_rule": "family"}
    return out


def _split(override: str) -> tuple[str, str]:
    text = override[2:] if override.startswith("--") else override
    if text.startswith("config."):
        text = text[len("config.") :]
    if "=" not in text:
        raise ConfigError(f"override {override!r}: expected --config.section.field=value")
    key, value = text.split("=", 1)
    return key.strip(), value


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _check_known_keys(
    config: ml_collections.ConfigDict, schema: ml_collections.ConfigDict, prefix: str = ""
) -> None:
    for key in config.keys():
        where = f"{prefix}{key}"
        if where == RESIDUAL:
            continue  # the family's own fields (validate checks them)
        if key not in schema:
            known = ", ".join(sorted(schema.keys()))
            raise ConfigError(f"config.{where}: unknown field; known fields here: {known}")
        if isinstance(config[key], ml_collections.ConfigDict):
            if not isinstance(schema[key], ml_collections.ConfigDict):
                raise ConfigError(f"config.{where}: is a field in the base spec, not a section")
            _check_known_keys(config[key], schema[key], where + ".")


def _positive(config: ml_collections.ConfigDict, dotted: str, *, allow_zero: bool = False) -> None:
    node, leaf = _lookup(config, dotted)
    value = node[leaf]
    ok = (
        isinstance(value, (int, float))
        and math.isfinite(value)
        and (value >= 0 if allow_zero else value > 0)
    )
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"config.{dotted}: must be a number {bound}, got {value!r}")


WANDB_MODES = ("", "offline", "online")  # train.wandb: off, or the W&B run's mode


def check_wandb_mode(mode) -> str:
    """``train.wandb``'s value, checked against :data:`WANDB_MODES`."""
    if mode not in WANDB_MODES:
        raise ConfigError(f"config.train.wandb: {mode!r} is not one of "
                          f"{', '.join(repr(m) for m in WANDB_MODES)}")
    return mode


def _choice(config: ml_collections.ConfigDict, dotted: str, allowed: Iterable[str]) -> None:
    node, leaf = _lookup(config, dotted)
    allowed = list(allowed)
    if node[leaf] not in allowed:
        raise ConfigError(f"config.{dotted}: {node[leaf]!r} is not one of {', '.join(allowed)}")


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Check a whole config; return it unchanged or raise one ConfigError."""
    _check_known_keys(config, base_config())
    _choice(config, "model.family", registry.names())
    _choice(config, "model.fix", ("total", "backbone"))
    _choice(config, "model.param_dtype", ("float32", "bfloat16"))
    _choice(config, "model.compute_dtype", ("float32", "bfloat16", "float16"))
    _choice(config, "model.remat_policy", remat_policy_names())
    _choice(config, "model.layer_scan", ("depth_linear", "carries"))
    _choice(config, "model.impl", ("xla", "pallas", "auto"))  # model/residual/parts/fused.py
    _choice(config, "model.attention_impl", ("xla", "cudnn"))
    _choice(config, "train.lr_rule", LR_RULES)
    _check_finetune(config)
    _check_lr_rule(config)
    _choice(config, "parallel.distributed", ("auto", "on", "off"))
    check_wandb_mode(config.train.get("wandb", ""))
    for field in (
        "model.depth",
        "model.vocab_size",
        "model.norm_eps",
        "model.rope_theta",
        "model.init_std",
        "model.scan_unroll",
        "train.steps",
        "train.batch_size",
        "train.microbatches",
        "train.seq_len",
        "train.lr",
        "train.log_every",
        "train.eval_every",
        "train.checkpoint_every",
        "train.max_loss",
        "train.clip_norm",
        "train.eps",
    ):
        _positive(config, field)
    for field in (
        "model.d_model",
        "model.d_ff",
        "model.n_heads",
        "model.n_kv_heads",
        "model.budget",
        "train.weight_decay",
        "train.warmup_fraction",
        "train.final_lr_fraction",
        "train.seed",
    ):
        _positive(config, field, allow_zero=True)
    if config.train.seed >= 1 << 32:  # jax's key takes 32 bits; more would alias another seed
        raise ConfigError(f"config.train.seed: must be in [0, 2**32 - 1], got {config.train.seed}")
    if config.train.batch_size % config.train.microbatches:
        raise ConfigError(
            f"config.train.microbatches: {config.train.microbatches} must divide "
            f"train.batch_size {config.train.batch_size}"
        )
    if not 0 <= config.train.warmup_fraction < 1:
        raise ConfigError("config.train.warmup_fraction: must be in [0, 1)")
    for axis in ("data", "fsdp", "tensor"):
        size = config.parallel[axis]
        if not isinstance(size, int) or (size < 1 and size != -1):
            raise ConfigError(
                f"config.parallel.{axis}: must be a positive integer or -1, got {size!r}"
            )
    # The shape must exist: suite row, budget reachable, heads dividing width.
    shapes.resolve_shape(config)
    registry.family_config(config.model.family, _residual_dict(config)).validate(config)
    return config


def _check_finetune(config: ml_collections.ConfigDict) -> None:
    """``train.schedule`` and the ``finetune`` section (a config saved before they
    existed has neither: what it lacks takes the default)."""
    if "schedule" in config.train:
        _choice(config, "train.schedule", ("cosine", "linear"))
    if "finetune" not in config:
        return
    _choice(config, "finetune.layout", ("padded", "packed"))
    _positive(config, "finetune.epochs")
    _positive(config, "finetune.max_samples", allow_zero=True)
    f = config.finetune
    if not 0 < f.val_fraction < 1:
        raise ConfigError(f"config.finetune.val_fraction: must be in (0, 1), got {f.val_fraction}")
    if f.max_seq_len < 2:
        raise ConfigError(f"config.finetune.max_seq_len: must be at least 2 (one response token "
                          f"and EOS), got {f.max_seq_len}")


def _check_lr_rule(config: ml_collections.ConfigDict) -> None:
    """``train.lr_rule = "family"`` needs a family that declares a rule."""
    family = config.model.family
    if config.train.lr_rule == "family" and not issubclass(registry.get(family),
                                                           LearningRateRule):
        having = [n for n in registry.names() if issubclass(registry.get(n), LearningRateRule)]
        raise ConfigError(f"config.train.lr_rule: 'family' needs a family with a learning-rate "
                          f"rule; {family} has none (families with one: "
                          f"{', '.join(having) or 'none'})")


def load(spec: str | Path, overrides: Iterable[str] = ()) -> ml_collections.ConfigDict:
    """Load a spec (bundled name or file), apply overrides and validate."""
    try:
        config = import_spec(spec).get_config()
    except ConfigError:
        raise
    except Exception as e:  # a spec failing when called is bad input, as when it fails to load
        raise ConfigError(f"config: get_config() in {str(spec)!r} failed: "
                          f"{type(e).__name__}: {e}") from e
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"config: get_config() in {str(spec)!r} must return a ConfigDict")
    config = apply_overrides(config, overrides)
    return validate(config)
