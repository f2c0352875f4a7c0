"""The cost model (:mod:`depthbench.costs`) applied to a sweep's shapes: a
row per shape for the costs table and plot, training FLOPs per token per run."""

from __future__ import annotations

from collections.abc import Sequence

from etils import epath

from depthbench import shapes
from depthbench.errors import ConfigError
from depthbench.report.rows import run_of


def _spec_of(workdir: epath.Path, row: dict):
    """(ModelSpec, seq_len) of a row: its recorded config, else its suite's shape
    at the row's seq_len; None for a damaged run, a rule-made shape with no
    recorded config, or a family this checkout does not know."""
    from depthbench.model.spec import ModelSpec

    run = None if row.get("damage") else run_of(workdir / row["name"])
    try:
        if run is not None:
            return ModelSpec.from_config(run.config), int(run.config.train.seq_len)
        if row.get("suite"):
            shape = shapes.suite(row["suite"]).shape(int(row["depth"]))
            return (ModelSpec.from_shape(shape, family=row["family"]),
                    int(row.get("seq_len") or 2048))
    except (ConfigError, KeyError):
        pass
    return None


def cost_rows(workdir: epath.Path, rows: Sequence[dict]) -> list[dict]:
    """depthbench.costs for every (family, suite, depth) of the sweep, at its seq_len."""
    from depthbench import costs

    seen, out = set(), []
    for r in rows:
        key = (r.get("suite") or "", r["family"], r["depth"])
        if key in seen:
            continue
        found = _spec_of(workdir, r)
        if found is None:
            continue
        spec, seq_len = found
        try:
            row = costs.cost_row(spec, seq_len)
        except (ConfigError, KeyError):
            continue  # a family this checkout does not know
        seen.add(key)
        out.append({**row, "family": r["family"], "suite": key[0], "seq_len": seq_len})
    return out


def train_flops_per_token(workdir: epath.Path, rows: Sequence[dict]) -> dict[str, float]:
    """{run name: the cost model's training FLOPs per token} of every run that
    can be costed (:func:`depthbench.costs.train_flops_per_token`); none for a
    damaged run, whose tokens are not trusted either."""
    from depthbench import costs

    out = {}
    for r in rows:
        found = None if r.get("damage") else _spec_of(workdir, r)
        if found is not None:
            try:
                out[r["name"]] = float(costs.train_flops_per_token(*found))
            except (ConfigError, KeyError):
                continue  # a family this checkout does not know
    return out
