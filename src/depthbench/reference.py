"""Published reference numbers of the original benchmark, as data.

The final validation losses of its ten designs on ``paper-400m``
(spec/shapes_and_recipe.md; the only suite with published numbers), which
``depthbench report`` draws beside a paper-scale sweep, and the analysis
numbers its paper quotes (docs/spec/analysis.md; docs/REPRODUCE.md puts each
beside the command that measures it)."""

from __future__ import annotations

import dataclasses

from depthbench import shapes

# design -> {depth: validation loss}; the table of spec/shapes_and_recipe.md,
# "Published reference numbers (400M, validation loss)", plus its L42/L70 line.
_DEPTHS_400M = (16, 20, 24, 28, 32)
_TABLE_400M = {
    "pre_ln": (2.759, 2.759, 2.765, 2.774, 2.782),
    "attnres_full": (2.751, 2.728, 2.726, 2.722, 2.718),
    "hc": (2.729, 2.716, 2.702, 2.714, 2.700),
    "sandwich_ln": (2.765, 2.754, 2.757, 2.757, 2.766),
    "lns": (2.749, 2.737, 2.740, 2.740, 2.739),
    "deepnorm": (2.790, 2.779, 2.796, 2.792, 2.798),
    "keel": (2.781, 2.768, 2.767, 2.771, 2.775),
    "moda": (2.753, 2.746, 2.764, 2.761, 2.780),
    "attnres_block": (2.734, 2.716, 2.719, 2.726, 2.730),
    "mhc": (2.720, 2.720, 2.710, 2.727, 2.721),
}
_DEEP_400M = {"attnres_full": {42: 2.708, 70: 2.702}, "hc": {42: 2.691, 70: 2.682}}

REFERENCE: dict[str, dict[str, dict[int, float]]] = {
    "paper-400m": {
        family: {**dict(zip(_DEPTHS_400M, losses, strict=True)), **_DEEP_400M.get(family, {})}
        for family, losses in _TABLE_400M.items()
    },
}

SOURCE = "spec/shapes_and_recipe.md, 'Published reference numbers (400M, validation loss)'"


# design -> (skip, swap): the fraction of late block pairs (both >= L/4) with causal
# score > 0.45 and with permutation score > 0.15, at paper-400m L32
# (analysis.json: late_layer_interaction.skip_fraction, .swap_fraction).
LATE_LAYER_400M_L32 = {"pre_ln": (0.01, 0.08), "attnres_full": (0.16, 0.46), "hc": (0.07, 0.35)}
# design -> (low, high): the effective rank of the composed residual mixing across
# the 400M runs (analysis.json: stream_diversity.composed_effective_rank_final).
STREAM_RANK_400M = {"mhc": (1.44, 1.65), "hc": (2.53, 2.81)}
# attnres_block at paper-400m: depth -> leading blocks whose mixes weigh the
# embedding most (analysis.json: depth_weights.dead_segment).
DEAD_SEGMENT_400M = {"attnres_block": {16: 2, 24: 5, 32: 8}}
ANALYSIS_SOURCE = ("docs/spec/analysis.md ('late-layer interaction', 'stream diversity', "
                   "'attnres depth weights'), from the original's paper")


@dataclasses.dataclass(frozen=True)
class ReferencePoint:
    suite: str
    family: str
    depth: int
    aspect_ratio: float
    val_loss: float


def losses(suite: str) -> dict[str, dict[int, float]]:
    """``{family: {depth: loss}}`` published for ``suite`` (empty if none)."""
    return {f: dict(by_depth) for f, by_depth in REFERENCE.get(suite, {}).items()}


def points(suite: str) -> list[ReferencePoint]:
    """The published losses of ``suite`` placed at the suite's aspect ratios."""
    table = REFERENCE.get(suite)
    if not table:
        return []
    s = shapes.suite(suite)
    out = []
    for family, by_depth in table.items():
        for depth, loss in sorted(by_depth.items()):
            out.append(ReferencePoint(suite, family, depth, s.shape(depth).aspect_ratio, loss))
    return out


def best_depth(suite: str, family: str) -> int | None:
    """The published best (lowest-loss) depth of ``family`` on ``suite``."""
    by_depth = REFERENCE.get(suite, {}).get(family)
    return min(by_depth, key=by_depth.get) if by_depth else None


__all__ = ["ANALYSIS_SOURCE", "DEAD_SEGMENT_400M", "LATE_LAYER_400M_L32", "REFERENCE", "SOURCE",
           "STREAM_RANK_400M", "ReferencePoint", "best_depth", "losses", "points"]
