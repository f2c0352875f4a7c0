"""Named variants of a residual family, for sweeps: ``hc+sum_then_norm``.

Each is a named set of config overrides, declared by the family
(``capabilities.Variants``) or here for every family (:data:`GENERAL`,
:data:`RULE`): a choice the sources disagree on, or a control for a confound
(docs/CONFIG.md, "Variants in a sweep")."""

from __future__ import annotations

from typing import Any

from depthbench.errors import ConfigError
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.capabilities import LearningRateRule, Variants

SEPARATOR = "+"

# Variants of every family (config overrides, dotted).
GENERAL: dict[str, dict[str, Any]] = {
    "norms_embeddings_residual": {"train.no_decay": "norms_embeddings_residual"},
}
# The variant of every family that declares a learning-rate rule: trained under it.
RULE: dict[str, dict[str, Any]] = {"lr_rule": {"train.lr_rule": "family"}}


def variants_of(family: str) -> dict[str, dict[str, Any]]:
    """Every variant ``family`` takes, as dotted config overrides: its config's
    own, :data:`RULE` if it has a learning-rate rule, then :data:`GENERAL`."""
    cls = registry.get(family)
    own = cls.Config.variants if issubclass(cls.Config, Variants) else {}
    fields = {name: {f"model.residual.{k}": v for k, v in values.items()}
              for name, values in own.items()}
    return {**fields, **(RULE if issubclass(cls, LearningRateRule) else {}), **GENERAL}


def split(label: str) -> tuple[str, tuple[str, ...]]:
    """``'hc+sum_then_norm'`` -> ``('hc', ('sum_then_norm',))``; an unknown family or
    a variant the family does not take is one ConfigError line naming the allowed."""
    family, *names = str(label).split(SEPARATOR)
    allowed = variants_of(family) if names else {}
    for name in names:
        if name not in allowed:
            raise ConfigError(f"config.model.family: variant {name!r} in {label!r} is not one of "
                              f"{family}'s: {', '.join(allowed)}")
    return family, tuple(names)


def expand_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A sweep entry with its family label replaced by the plain family and the
    variants' overrides (an entry that also sets one of those fields is refused)."""
    label = entry.get("model.family")
    if not isinstance(label, str) or SEPARATOR not in label:
        return dict(entry)
    family, names = split(label)
    out = {**entry, "model.family": family}
    overrides = variants_of(family)
    for name in names:
        for key, value in overrides[name].items():
            if key in entry or (key in out and out[key] != value):
                raise ConfigError(f"config.model.family: variant {name!r} of {label!r} sets "
                                  f"{key}, which the entry sets too")
            out[key] = value
    return out


def label(overrides: dict[str, Any], family: str) -> str:
    """The family as results.csv names it: the entry's label when it has variants,
    else the config's family."""
    named = overrides.get("model.family")
    return named if isinstance(named, str) and SEPARATOR in named else family
