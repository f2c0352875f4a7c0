"""Expanding a sweep spec into runs: each run's name, overrides and validated config.

``get_sweep()`` returns one override dict per run (docs/CONFIG.md).
Command-line overrides apply to every run (a family's field only to the runs
whose family has it); a run's own overrides win, and overriding a swept field
on the command line is an error (it would silently do nothing).  ``--shard
i/N``, ``--run NAME`` and ``--only I`` select runs."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Any

import ml_collections

from depthbench import config as config_lib
from depthbench import costs, shapes, variants
from depthbench.errors import ConfigError
from depthbench.formatting import run_name
from depthbench.model.residual.protocol import registry
from depthbench.model.spec import ModelSpec


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep: its position, name, overrides and resolved config."""

    index: int
    name: str
    overrides: tuple[tuple[str, Any], ...]
    config: ml_collections.ConfigDict = dataclasses.field(compare=False, repr=False)

    @property
    def shape(self) -> shapes.Shape:
        return shapes.resolve_shape(self.config)

    def static_row(self) -> dict:
        """The results.csv row known before training (no measured values)."""
        c, s = self.config, self.shape
        try:
            params = costs.param_count(ModelSpec.from_config(c))
        except ConfigError:  # a recorded run of a family this checkout does not know
            params = s.total_params
        return {
            "name": self.name, "family": variants.label(dict(self.overrides), c.model.family),
            "suite": c.model.suite,
            "depth": s.depth, "d_model": s.d_model, "aspect_ratio": round(s.aspect_ratio, 4),
            "lr": float(c.train.lr), "params": int(params), "seq_len": int(c.train.seq_len),
            "steps": int(c.train.steps),
            "tokens": int(c.train.steps) * int(c.train.batch_size) * int(c.train.seq_len),
            "final_val_loss": None, "tokens_per_sec": None, "mfu": None,
            "diverged_at_step": None, "wall_seconds": None, "status": "pending",
        }


@dataclasses.dataclass(frozen=True)
class Sweep:
    spec: str
    cli_overrides: tuple[str, ...]
    runs: tuple[Run, ...]

    def by_name(self) -> dict[str, Run]:
        return {r.name: r for r in self.runs}

    def select(self, *, shard: tuple[int, int] = (0, 1), names: Sequence[str] = (),
               indices: Sequence[int] = ()) -> list[Run]:
        """The runs of one shard (every N-th by sweep index), optionally only
        those matching ``names`` (exact or fnmatch patterns) or ``indices``."""
        i, n = shard
        chosen = [r for r in self.runs if r.index % n == i]
        if names:
            for pattern in names:
                if not any(fnmatchcase(r.name, pattern) for r in self.runs):
                    sample = ", ".join(r.name for r in self.runs[:3])
                    raise ConfigError(f"--run: no run of the sweep is named {pattern!r} "
                                      f"(names look like {sample}; see --list)")
            chosen = [r for r in chosen if any(fnmatchcase(r.name, p) for p in names)]
        if indices:
            for k in indices:
                if not 0 <= k < len(self.runs):
                    raise ConfigError(f"--only: index {k} is out of range; the sweep has "
                                      f"{len(self.runs)} runs (0 .. {len(self.runs) - 1})")
            chosen = [r for r in chosen if r.index in set(indices)]
        return chosen


_RESIDUAL = "model.residual."


def _override_key(text: str) -> str:
    text = text[2:] if text.startswith("--") else text
    text = text.removeprefix("config.")
    return text.split("=", 1)[0].strip()


def expand(spec: str | os.PathLike, cli_overrides: Iterable[str] = ()) -> Sweep:
    """Load a sweep spec and resolve every run's config (validated, no training)."""
    cli_overrides = tuple(cli_overrides)
    module = config_lib.import_spec(spec)
    if not callable(getattr(module, "get_sweep", None)):
        raise ConfigError(f"config: spec file {str(spec)!r} has no get_sweep(); "
                          "`depthbench train` runs a spec without one")
    base = _call(module, "get_config", spec)
    if not isinstance(base, ml_collections.ConfigDict):
        raise ConfigError(f"config: get_config() in {str(spec)!r} must return a ConfigDict")
    entries = _call(module, "get_sweep", spec)
    if not isinstance(entries, (list, tuple)):
        raise ConfigError(f"config: get_sweep() in {str(spec)!r} must return a list of dicts "
                          f"{{'section.field': value}}, got {type(entries).__name__}")
    if not entries:
        raise ConfigError(f"config: get_sweep() in {str(spec)!r} returned no runs")
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict) or not all(isinstance(key, str) for key in entry):
            raise ConfigError(f"config: get_sweep() in {str(spec)!r}: entry {k} must be a dict "
                              f"{{'section.field': value}}, got {entry!r}")
    try:  # a variant's fields count as swept: a command-line value would be ignored
        swept = {key for entry in entries for key in variants.expand_entry(entry)}
    except ConfigError as e:
        raise ConfigError(f"{e} (get_sweep() in {str(spec)!r})") from None
    for text in cli_overrides:
        key = _override_key(text)
        if key in swept:
            raise ConfigError(f"--config.{key}: the sweep sets it per run ({str(spec)!r} "
                              "get_sweep()); select runs with --run NAME instead")
    # A family's field from the command line goes to the runs whose family has it
    # (the base config's family may not); one no run's family has is refused.
    family_fields = [t for t in cli_overrides if _override_key(t).startswith(_RESIDUAL)]
    base = config_lib.apply_overrides(
        base, [t for t in cli_overrides if t not in family_fields])
    runs, seen, used = [], {}, set()
    for k, entry in enumerate(entries):
        try:
            config = config_lib.apply_overrides(base, variants.expand_entry(entry))
            own = registry.get(config.model.family).config_fields()
            mine = [t for t in family_fields if _override_key(t)[len(_RESIDUAL):] in own]
            used.update(mine)
            config = config_lib.validate(config_lib.apply_overrides(config, mine))
        except ConfigError as e:
            raise ConfigError(f"sweep run {k} ({_label(entry)}): {e}") from None
        name = run_name(entry)  # after the checks: a value of the wrong type has no name
        if name in seen:
            raise ConfigError(f"config: get_sweep() in {str(spec)!r}: runs {seen[name]} and {k} "
                              f"have the same name {name!r} (identical overrides?)")
        seen[name] = k
        runs.append(Run(k, name, tuple(entry.items()), config))
    for text in family_fields:
        if text not in used:
            families = sorted({run.config.model.family for run in runs})
            raise ConfigError(f"--config.{_override_key(text)}: no run's family has that field "
                              f"(the sweep's families: {', '.join(families)})")
    return Sweep(str(config_lib.spec_path(spec).resolve()), cli_overrides, tuple(runs))


def _call(module, function: str, spec) -> Any:
    """``module.function()``; a spec failing when called is bad input, as one failing
    to load is (the config loader says the same of get_config)."""
    try:
        return getattr(module, function)()
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"config: {function}() in {str(spec)!r} failed: "
                          f"{type(e).__name__}: {e}") from e


def _label(entry: dict) -> str:
    """A run's name for an error message, or its overrides where they give none."""
    try:
        return run_name(entry)
    except (TypeError, ValueError):
        return ", ".join(f"{k}={v!r}" for k, v in entry.items())


def parse_shard(text: str | None) -> tuple[int, int]:
    """'1/4' -> (1, 4): run every 4th run starting at index 1 (0-based)."""
    if text is None:
        return (0, 1)
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise ConfigError(f"--shard: expected i/N with 0 <= i < N (e.g. 0/4), got {text!r}")
    return int(m.group(1)), int(m.group(2))
