"""A muP-style coordinate check across depth and width (``depthbench coordcheck``).

Fresh models train a few steps at a constant learning rate and the size of
every depth state, and of how far training moved it, is measured after each
step (docs/COORDCHECK.md).  Nothing here names a family: states come through
its analysis probes, the learning-rate rule through its ``LearningRateRule``."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from depthbench import config as config_lib
from depthbench import costs, data, parallel, variants
from depthbench.errors import ConfigError
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.capabilities import LearningRateRule
from depthbench.model.spec import ModelSpec


def default_families() -> tuple[str, ...]:
    """The baseline and every family with a learning-rate rule (CompleteP's): the
    rule is what the check is for."""
    return (registry.baseline(), *registry.with_capability(LearningRateRule))


DEFAULT_DEPTHS = (2, 4, 8)
DEFAULT_WIDTHS = (64, 128)
DEFAULT_STEPS = 3
LR_RULES = ("auto", "none")  # auto: the family's own rule where it declares one


@dataclasses.dataclass(frozen=True)
class Point:
    """One model of the check: its shape and its residual stream over the steps."""

    family: str  # the label asked for (a variant keeps its ``+name``)
    depth: int
    width: int
    params: int
    lr_rule: str  # "family" or "none": what it trained with
    losses: tuple[float, ...]  # training loss of each update (k of them)
    state_rms: np.ndarray  # [k + 1, L + 1]
    delta_rms: np.ndarray  # [k + 1, L + 1]

    @classmethod
    def from_dict(cls, d: dict) -> Point:
        return cls(str(d["family"]), int(d["depth"]), int(d["width"]), int(d["params"]),
                   str(d["lr_rule"]), tuple(d["losses"]),
                   np.asarray(d["state_rms"], np.float64), np.asarray(d["delta_rms"], np.float64))

    def as_dict(self) -> dict:
        return {"family": self.family, "depth": self.depth, "width": self.width,
                "params": self.params, "lr_rule": self.lr_rule, "losses": list(self.losses),
                "state_rms": self.state_rms.tolist(), "delta_rms": self.delta_rms.tolist()}


def loglog_slope(x: Sequence[float], y: Sequence[float], groups: Sequence) -> float | None:
    """The least-squares slope of ``log y`` against ``log x`` with one intercept
    per group (a fixed-effects fit: each group is centred on its own means, then
    one slope fits all), or None when no group has two distinct ``x`` or a
    ``y`` is not positive and finite."""
    lx, ly = np.log(np.asarray(x, np.float64)), np.asarray(y, np.float64)
    if not np.all(np.isfinite(ly) & (ly > 0)):
        return None
    ly = np.log(ly)
    keys = list(groups)
    num = den = 0.0
    for g in set(keys):
        idx = [i for i, k in enumerate(keys) if k == g]
        cx, cy = lx[idx] - lx[idx].mean(), ly[idx] - ly[idx].mean()
        num, den = num + float(cx @ cy), den + float(cx @ cx)
    return num / den if den > 1e-12 else None


def family_slopes(points: Sequence[Point], step: int | None = None) -> dict[str, float | None]:
    """``depth_slope``, ``width_slope`` and their ``delta_`` twins for one family's
    points, of the final state ``z_L`` after ``step`` updates (default: the last)."""
    t = -1 if step is None else step
    final = [float(p.state_rms[t][-1]) for p in points]
    moved = [float(p.delta_rms[t][-1]) for p in points]
    depths, widths = [p.depth for p in points], [p.width for p in points]
    return {"depth_slope": loglog_slope(depths, final, widths),
            "width_slope": loglog_slope(widths, final, depths),
            "delta_depth_slope": loglog_slope(depths, moved, widths),
            "delta_width_slope": loglog_slope(widths, moved, depths)}


def lr_rule_for(family: str, rule: str) -> str:
    """``train.lr_rule`` for ``family``: its own rule under ``auto`` when it
    declares one, else none."""
    if rule not in LR_RULES:
        raise ConfigError(f"--lr-rule: {rule!r} is not one of {', '.join(LR_RULES)}")
    plain, _ = variants.split(family)
    has_rule = issubclass(registry.get(plain), LearningRateRule)
    return "family" if rule == "auto" and has_rule else "none"


def point_config(base: ml_collections.ConfigDict, family: str, depth: int, width: int, *,
                 heads: int, steps: int, rule: str) -> ml_collections.ConfigDict:
    """The config of one point: ``base`` at width ``width`` (``d_ff`` by the shape
    rule, ``heads`` heads), depth ``depth``, trained ``steps`` updates at the
    constant peak learning rate (no warmup, no decay)."""
    overrides = variants.expand_entry({"model.family": family})
    overrides.update({
        "model.suite": "", "model.depth": depth, "model.d_model": width, "model.d_ff": 0,
        "model.n_heads": heads, "model.n_kv_heads": 0, "train.steps": max(steps, 1),
        "train.warmup_fraction": 0.0, "train.final_lr_fraction": 1.0})
    overrides.setdefault("train.lr_rule", lr_rule_for(family, rule))  # a variant's own wins
    try:
        return config_lib.validate(config_lib.apply_overrides(base, overrides))
    except ConfigError as e:
        raise ConfigError(f"coordcheck {family} L{depth} d{width}: {e}") from None


def _states_fn(s):
    """``(params, inputs) -> z [L+1, B, T, d]`` (fp32, replicated), jitted."""

    def states(params, inputs):
        return s.model.apply({"params": params}, inputs, capture=("z",))[1]["z"].astype(
            jnp.float32)

    return jax.jit(states, in_shardings=(s.param_shardings, parallel.batch_sharding(s.mesh)),
                   out_shardings=parallel.replicated(s.mesh))


def _rms(z: np.ndarray) -> np.ndarray:
    """RMS over every axis but the first (the depth states)."""
    z = np.asarray(z, np.float64)
    return np.sqrt(np.mean(np.square(z), axis=tuple(range(1, z.ndim))))


def measure_point(config: ml_collections.ConfigDict, family: str, steps: int,
                  train_batches: Sequence[dict], probe: dict) -> Point:
    """Train one point ``steps`` updates on ``train_batches`` (host batches) and
    measure its residual stream on ``probe`` after each."""
    from depthbench.train import state as state_lib
    from depthbench.train import step as step_lib

    s = state_lib.setup(config, parallel.mesh_from_config(config))
    train, states = step_lib.make_train_step(s), _states_fn(s)
    state = state_lib.init_state(s, int(config.train.seed))
    inputs = parallel.host_batch_to_global(probe, s.mesh)["inputs"]
    with s.context():
        z0 = np.asarray(jax.device_get(states(state.params, inputs)))
        state_rms, delta_rms, losses = [_rms(z0)], [np.zeros(len(z0))], []
        for t in range(steps):
            batch = parallel.host_batch_to_global(train_batches[t], s.mesh)
            state, metrics = train(state, batch)
            losses.append(float(jax.device_get(metrics["loss"])))
            z = np.asarray(jax.device_get(states(state.params, inputs)))
            state_rms.append(_rms(z))
            delta_rms.append(_rms(z - z0))
    spec = ModelSpec.from_config(config)
    return Point(family, spec.depth, spec.d_model, int(costs.param_count(spec)),
                 str(config.train.lr_rule), tuple(losses), np.stack(state_rms),
                 np.stack(delta_rms))


def _check_grid(families, depths, widths, steps: int, heads: int) -> None:
    for family in families:
        try:
            registry.get(variants.split(family)[0])  # unknown family or variant: one line
        except ConfigError as e:
            raise ConfigError(f"--families: {e}") from None
    if not families:
        raise ConfigError("--families: give at least one family")
    if len(set(depths)) < 2 and len(set(widths)) < 2:
        raise ConfigError("--depths/--widths: give at least two depths or two widths (a slope "
                          "needs two points)")
    if any(d < 1 for d in depths):
        raise ConfigError(f"--depths: every depth must be >= 1, got {list(depths)}")
    if heads < 1 or any(w < 1 or w % heads or (w // heads) % 2 for w in widths):
        raise ConfigError(f"--widths: every width must be a positive multiple of 2 x --heads "
                          f"({heads}: an even head_dim), got {list(widths)}")
    if not 0 <= steps <= 100:
        raise ConfigError(f"--steps: expected 0 .. 100 updates (a coordinate check is a few), "
                          f"got {steps}")


@dataclasses.dataclass(frozen=True)
class CoordCheck:
    """Every point of one check, and the settings it ran with."""

    points: tuple[Point, ...]
    settings: dict
    seconds: float

    def families(self) -> list[str]:
        return list(dict.fromkeys(p.family for p in self.points))

    def of(self, family: str) -> list[Point]:
        return [p for p in self.points if p.family == family]

    def slopes(self) -> dict[str, dict]:
        return {f: {**family_slopes(self.of(f)), "lr_rule": self.of(f)[0].lr_rule}
                for f in self.families()}

    @classmethod
    def from_dict(cls, record: dict, families: Sequence[str] | None = None) -> CoordCheck:
        """A check read back from :meth:`as_dict` (``--json``), optionally only
        some of its families (to redraw them)."""
        points = tuple(Point.from_dict(p) for p in record["points"]
                       if families is None or p["family"] in families)
        settings = dict(record["settings"])
        settings["families"] = list(dict.fromkeys(p.family for p in points))
        return cls(points, settings, float(record.get("seconds", 0.0)))

    def as_dict(self) -> dict:
        steps = range(self.settings["steps"] + 1)
        per_step = {f: [{"step": t, **family_slopes(self.of(f), t)} for t in steps]
                    for f in self.families()}
        return {"settings": self.settings, "seconds": round(self.seconds, 1),
                "families": {f: {**v, "by_step": per_step[f]} for f, v in self.slopes().items()},
                "points": [p.as_dict() for p in self.points]}


def run(base: ml_collections.ConfigDict, families: Sequence[str] | None = None,
        depths: Sequence[int] = DEFAULT_DEPTHS, widths: Sequence[int] = DEFAULT_WIDTHS, *,
        steps: int = DEFAULT_STEPS, heads: int = 4, lr_rule: str = "auto",
        progress: Callable[[str], None] | None = None) -> CoordCheck:
    """The coordinate check of every (family, depth, width), each model trained
    on the same batches of ``base``'s data at ``base``'s peak learning rate
    (``families``: :func:`default_families` when None)."""
    start = time.perf_counter()
    families = list(default_families() if families is None else families)
    depths, widths = sorted(set(depths)), sorted(set(widths))
    _check_grid(families, depths, widths, steps, heads)
    configs = {(f, L, w): point_config(base, f, L, w, heads=heads, steps=steps, rule=lr_rule)
               for f in families for L in depths for w in widths}
    first = next(iter(configs.values()))
    prepared = data.prepare(first, progress=False)
    it = data.train_iterator(first, prepared)
    train_batches = [next(it) for _ in range(steps)]
    probe = data.val_batches(first, prepared)[0]
    points = []
    for (family, depth, width), config in configs.items():
        point = measure_point(config, family, steps, train_batches, probe)
        points.append(point)
        if progress is not None:
            progress(f"{family} L{depth} d{width}: RMS(z_L) {point.state_rms[0][-1]:.4g} -> "
                     f"{point.state_rms[-1][-1]:.4g}, moved {point.delta_rms[-1][-1]:.4g}")
    t = first.train
    settings = {"families": families, "depths": depths, "widths": widths, "steps": steps,
                "heads": heads, "lr": float(t.lr), "lr_rule": lr_rule,
                "batch_size": int(t.batch_size), "seq_len": int(t.seq_len),
                "corpus": str(first.data.corpus), "seed": int(t.seed)}
    return CoordCheck(tuple(points), settings, time.perf_counter() - start)


def fmt_slope(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:+.3f}"


SLOPE_HEADERS = ("family", "lr rule", "depth slope", "width slope", "depth slope (moved)",
                 "width slope (moved)")


def slope_rows(check: CoordCheck) -> list[list[str]]:
    """The slopes table's rows, one per family (see :data:`SLOPE_HEADERS`)."""
    return [[family, v["lr_rule"], fmt_slope(v["depth_slope"]), fmt_slope(v["width_slope"]),
             fmt_slope(v["delta_depth_slope"]), fmt_slope(v["delta_width_slope"])]
            for family, v in check.slopes().items()]
