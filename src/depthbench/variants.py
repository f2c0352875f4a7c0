"""Named variants of a residual family, for sweeps: ``hc+sum_then_norm``.

A sweep entry may name its family with variants appended by ``+``::

    {"model.family": "hc+sum_then_norm", "model.depth": 4, "train.lr": 3e-3}

Each variant is a named set of config overrides (:data:`VARIANTS`).  The run
trains the plain family with those overrides; its name shows the label
(``hc+sum_then_norm-L4-lr3e-03``) and results.csv's ``family`` column carries
it, so the report gives the variant a row of its own beside the family's.
The label is the sweep entry's, recorded with the run's overrides in
``sweep_run.json``, so it survives re-runs and ``depthbench report``.

A variant is a choice the sources disagree on, or a control for a confound
(spec/residuals.md): the hc/mhc readout (``norm_then_sum``, the original
benchmark's default, makes the initial logits ``n`` times pre_ln's;
``sum_then_norm`` is the HC paper's form and matches pre_ln at init), moda's
norm placement and depth query, depth-muP instead of CompleteP, and the
weight-decay set.
"""

from __future__ import annotations

from typing import Any

from depthbench.errors import ConfigError

SEPARATOR = "+"

VARIANTS: dict[str, dict[str, Any]] = {
    "sum_then_norm": {"model.residual.readout": "sum_then_norm"},
    "norm_then_sum": {"model.residual.readout": "norm_then_sum"},
    "pre_norm": {"model.residual.moda_norm": "pre"},
    "post_norm": {"model.residual.moda_norm": "post"},
    "unrotated_query": {"model.residual.moda_depth_query": "unrotated"},
    "depth_mup": {"model.residual.completep_alpha": 0.5},
    "norms_embeddings_residual": {"train.no_decay": "norms_embeddings_residual"},
}


def split(label: str) -> tuple[str, tuple[str, ...]]:
    """``'hc+sum_then_norm'`` -> ``('hc', ('sum_then_norm',))``; unknown variants
    are one ConfigError line naming the allowed ones."""
    family, *names = str(label).split(SEPARATOR)
    for name in names:
        if name not in VARIANTS:
            raise ConfigError(f"config.model.family: variant {name!r} in {label!r} is not one of "
                              f"{', '.join(VARIANTS)}")
    return family, tuple(names)


def expand_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A sweep entry with its family label replaced by the plain family and the
    variants' overrides (an entry that also sets one of those fields is refused)."""
    label = entry.get("model.family")
    if not isinstance(label, str) or SEPARATOR not in label:
        return dict(entry)
    family, names = split(label)
    out = {**entry, "model.family": family}
    for name in names:
        for key, value in VARIANTS[name].items():
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
