"""Model shapes at a fixed parameter budget: the shape rule and the suites
(spec/shapes_and_recipe.md).  The paper's suites are explicit tables (two of
their rows differ from the rule); ``micro`` is the rule at a CPU-sized budget."""

from __future__ import annotations

import dataclasses
import math

from depthbench.errors import ConfigError
from depthbench.formatting import parse_count

PAPER_VOCAB = 50280


@dataclasses.dataclass(frozen=True)
class Shape:
    """One model shape.  Parameter counts are the backbone formula of the spec
    (pre_ln); families add their own extras through ``costs``/the registry."""

    depth: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def aspect_ratio(self) -> float:
        return self.d_model / self.depth

    @property
    def block_params(self) -> int:
        """Attention (q, k, v, o with GQA) + SwiGLU + two RMSNorm weights."""
        d, kv = self.d_model, self.n_kv_heads * self.head_dim
        return 2 * d * d + 2 * d * kv + 3 * d * self.d_ff + 2 * d

    @property
    def backbone_params(self) -> int:
        return self.depth * self.block_params

    @property
    def total_params(self) -> int:
        """Backbone + untied input/output embeddings + final norm."""
        return self.backbone_params + 2 * self.vocab_size * self.d_model + self.d_model

    def as_dict(self) -> dict:
        return {
            "depth": self.depth,
            "d_model": self.d_model,
            "d_ff": self.d_ff,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "aspect_ratio": round(self.aspect_ratio, 4),
            "backbone_params": self.backbone_params,
            "total_params": self.total_params,
        }


def rule_d_ff(d_model: int) -> int:
    """ceil(8/3 d) rounded up to a multiple of 16."""
    return 16 * math.ceil(math.ceil(8 * d_model / 3) / 16)


def from_rule(
    budget: float,
    vocab_size: int,
    depth: int,
    *,
    n_heads: int = 16,
    fix: str = "total",
    n_kv_heads: int = 0,
    max_head_dim: int = 1024,
) -> Shape:
    """The even head_dim whose count (total or backbone) is closest to ``budget``."""
    if depth < 1:
        raise ConfigError(f"config.model.depth: must be >= 1, got {depth}")
    if fix not in ("total", "backbone"):
        raise ConfigError(f"config.model.fix: {fix!r} is not one of total, backbone")

    def make(head_dim: int) -> Shape:
        d = n_heads * head_dim
        return Shape(depth, d, rule_d_ff(d), n_heads, n_kv_heads or n_heads, vocab_size)

    def count(s: Shape) -> int:
        return s.total_params if fix == "total" else s.backbone_params

    smallest = make(2)
    if count(smallest) > budget * 1.5:
        raise ConfigError(
            f"config.model.depth: depth {depth} cannot meet a {fix} budget of {budget:.3g} "
            f"parameters (the narrowest shape, d_model {smallest.d_model}, already has "
            f"{count(smallest):.3g}); lower the depth or raise config.model.budget"
        )
    widest = make(max_head_dim)
    if count(widest) < budget / 1.5:
        raise ConfigError(
            f"config.model.budget: a {fix} budget of {budget:.3g} parameters is out of reach at "
            f"depth {depth} (the widest shape, d_model {widest.d_model}, has "
            f"{count(widest):.3g}); lower the budget or raise config.model.depth"
        )
    best = min(
        (make(h) for h in range(2, max_head_dim + 1, 2)), key=lambda s: abs(count(s) - budget)
    )
    return best


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    description: str
    budget: float  # the budget the suite was built for
    fix: str  # "total" | "backbone"
    vocab_size: int
    n_heads: int
    n_kv_heads: int
    rows: tuple[tuple[int, int, int], ...]  # (depth, d_model, d_ff)

    def shapes(self) -> list[Shape]:
        return [
            Shape(L, d, ff, self.n_heads, self.n_kv_heads, self.vocab_size)
            for L, d, ff in self.rows
        ]

    def shape(self, depth: int) -> Shape:
        for s in self.shapes():
            if s.depth == depth:
                return s
        depths = ", ".join(str(r[0]) for r in self.rows)
        raise ConfigError(
            f"config.model.depth: suite {self.name!r} has no depth {depth}; "
            f"allowed: {depths} (or set config.model.suite='' to use the shape rule)"
        )


def _table(text: str) -> tuple[tuple[int, int, int], ...]:
    return tuple(tuple(int(v) for v in row.split("/")) for row in text.split())


MICRO_VOCAB = 2048
MICRO_BUDGET = 1.2e6
MICRO_HEADS = 4

SUITES: dict[str, Suite] = {
    s.name: s
    for s in [
        Suite(
            "paper-400m",
            "fixed total ~400M (the original benchmark's main suite)",
            400e6,
            "total",
            PAPER_VOCAB,
            16,
            16,
            _table(
                "16/1216/3248 20/1120/2992 24/1024/2736 28/960/2560 32/896/2400 "
                "42/800/2144 70/640/1712"
            ),
        ),
        Suite(
            "paper-300m-backbone",
            "fixed backbone ~300M (Kaplan-style count)",
            300e6,
            "backbone",
            PAPER_VOCAB,
            16,
            16,
            _table("16/1248/3328 24/1024/2736 32/896/2400 42/768/2048 70/608/1632 84/544/1456"),
        ),
        Suite(
            "paper-200m",
            "multi-scale: fixed total ~200M",
            200e6,
            "total",
            PAPER_VOCAB,
            16,
            16,
            _table("12/896/2400 18/768/2048 24/672/1792"),
        ),
        Suite(
            "paper-300m",
            "multi-scale: fixed total ~300M",
            300e6,
            "total",
            PAPER_VOCAB,
            16,
            16,
            _table("14/1056/2816 21/896/2400 28/800/2144"),
        ),
        Suite(
            "paper-500m",
            "multi-scale: fixed total ~500M",
            500e6,
            "total",
            PAPER_VOCAB,
            16,
            16,
            _table("17/1344/3584 26/1120/2992 34/992/2656"),
        ),
        Suite(
            "paper-1p6b",
            "fixed total ~1.6B, GQA (16 query / 8 KV heads), d_ff = 3d",
            1.6e9,
            "total",
            PAPER_VOCAB,
            16,
            8,
            _table("28/2048/6144 40/1728/5184 54/1504/4512"),
        ),
    ]
}


def _micro_suite() -> Suite:
    rows = []
    for depth in (2, 3, 4, 6, 8, 10):
        s = from_rule(MICRO_BUDGET, MICRO_VOCAB, depth, n_heads=MICRO_HEADS, fix="total")
        rows.append((s.depth, s.d_model, s.d_ff))
    return Suite(
        "micro",
        "CPU-sized: ~1.2M parameters, 4 heads, vocabulary 2048",
        MICRO_BUDGET,
        "total",
        MICRO_VOCAB,
        MICRO_HEADS,
        MICRO_HEADS,
        tuple(rows),
    )


SUITES["micro"] = _micro_suite()


def suite(name: str) -> Suite:
    if name not in SUITES:
        raise ConfigError(f"suite {name!r} is unknown; allowed: {', '.join(SUITES)}")
    return SUITES[name]


def resolve_shape(config) -> Shape:
    """The shape a config asks for (see configs/base.py for the order)."""
    m = config.model
    vocab = int(m.vocab_size)
    if m.d_model > 0:
        n_heads = m.n_heads or 16
        if m.d_model % n_heads:
            raise ConfigError(
                f"config.model.n_heads: {n_heads} heads do not divide d_model {m.d_model}"
            )
        shape = Shape(
            int(m.depth),
            int(m.d_model),
            int(m.d_ff) or rule_d_ff(m.d_model),
            n_heads,
            m.n_kv_heads or n_heads,
            vocab,
        )
    elif m.suite:
        s = suite(m.suite) if m.suite in SUITES else None
        if s is None:
            raise ConfigError(
                f"config.model.suite: {m.suite!r} is unknown; allowed: "
                f"{', '.join(SUITES)} or '' (shape rule)"
            )
        row = s.shape(int(m.depth))
        n_heads = m.n_heads or row.n_heads
        n_kv = m.n_kv_heads or (row.n_kv_heads if n_heads == row.n_heads else n_heads)
        shape = dataclasses.replace(row, vocab_size=vocab, n_heads=n_heads, n_kv_heads=n_kv)
        if shape.d_model % n_heads:
            raise ConfigError(
                f"config.model.n_heads: {n_heads} heads do not divide d_model {shape.d_model}"
            )
    else:
        if m.budget <= 0:
            raise ConfigError(
                "config.model.budget: must be > 0 when config.model.suite is '' "
                "and config.model.d_model is 0"
            )
        shape = from_rule(
            float(m.budget),
            vocab,
            int(m.depth),
            n_heads=m.n_heads or 16,
            fix=m.fix,
            n_kv_heads=m.n_kv_heads,
        )
    if shape.n_heads % shape.n_kv_heads:
        raise ConfigError(
            f"config.model.n_kv_heads: {shape.n_kv_heads} must divide n_heads {shape.n_heads}"
        )
    if shape.head_dim % 2:
        raise ConfigError(
            f"config.model.n_heads: head_dim {shape.head_dim} must be even (RoPE rotates pairs)"
        )
    return shape


_SHAPE_FIELDS = ("depth", "d_model", "d_ff", "n_heads", "n_kv_heads")


def _check_heads(shape: Shape, field: str) -> Shape:
    if shape.d_model % shape.n_heads:
        raise ConfigError(f"{field}.n_heads: {shape.n_heads} heads do not divide d_model "
                          f"{shape.d_model}")
    if shape.n_heads % shape.n_kv_heads:
        raise ConfigError(f"{field}.n_kv_heads: {shape.n_kv_heads} must divide n_heads "
                          f"{shape.n_heads}")
    if shape.head_dim % 2:
        raise ConfigError(f"{field}.n_heads: head_dim {shape.head_dim} must be even (RoPE "
                          "rotates pairs)")
    return shape


def recorded_shape(config, recorded, field: str) -> Shape:
    """The shape a run recorded when it started (its config.json's
    ``resolved.shape``, named ``field`` in errors), with the config's
    vocabulary; a run without the record resolves its config
    (:func:`resolve_shape`).  The record is what the run's checkpoints were
    made with, whatever a suite's table says today."""
    if recorded is None:
        return resolve_shape(config)
    if not isinstance(recorded, dict):
        raise ConfigError(f"{field}: expected a JSON object")
    values = {}
    for key in _SHAPE_FIELDS:
        value = recorded.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 1 << 31:
            raise ConfigError(f"{field}.{key}: expected an integer in [1, 2**31), got "
                              f"{str(value)[:40]!r}")
        values[key] = value
    vocab = config.model.vocab_size
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 1 <= vocab < 1 << 31:
        raise ConfigError(f"config.model.vocab_size: expected an integer in [1, 2**31), got "
                          f"{str(vocab)[:40]!r}")
    return _check_heads(Shape(vocab_size=vocab, **values), field)


def complete_shape(config, shape: Shape):
    """A copy of ``config`` whose model states ``shape`` outright (``depth``,
    ``d_model``, ``d_ff``, ``n_heads``, ``n_kv_heads``, ``vocab_size``): what
    :func:`resolve_shape` reads back as ``shape`` without a suite or a rule."""
    out = config.copy_and_resolve_references()
    for key in (*_SHAPE_FIELDS, "vocab_size"):
        out.model[key] = getattr(shape, key)
    return out


__all__ = [
    "Shape",
    "Suite",
    "SUITES",
    "complete_shape",
    "from_rule",
    "parse_count",
    "recorded_shape",
    "resolve_shape",
    "rule_d_ff",
    "suite",
]
