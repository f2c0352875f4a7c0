"""Loss curves against tokens and FLOPs, and what they say at equal cost.

Pure functions of a few numbers, no files (``section.py`` reads the runs):
the monotone fit of a curve (so one noisy batch never decides where it
crosses a loss), the tokens it needs to reach a loss, a run's speedup over a
baseline and the reverse, and every curve's loss at a shared budget
(docs/EQUAL_COMPUTE.md, "Which curve")."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence

import numpy as np


def monotone_fit(loss: Sequence[float]) -> np.ndarray:
    """The non-increasing sequence closest to ``loss`` in least squares:
    adjacent values that rise are pooled into their mean until none does."""
    blocks: list[list[float]] = []  # [sum, count] of each pooled run of points
    for value in loss:
        blocks.append([float(value), 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    if not blocks:
        return np.zeros(0)
    return np.concatenate([np.full(int(count), total / count) for total, count in blocks])


def moving_mean(values: Sequence[float], half_width: int) -> np.ndarray:
    """Each value averaged with up to ``half_width`` neighbours on each side
    (fewer at the ends): the last logged value of a noisy curve is then not
    one batch's loss alone."""
    v = np.asarray(values, dtype=np.float64)
    if half_width <= 0 or v.size == 0:
        return v
    sums = np.concatenate([[0.0], np.cumsum(v)])
    lo = np.maximum(np.arange(v.size) - half_width, 0)
    hi = np.minimum(np.arange(v.size) + half_width + 1, v.size)
    return (sums[hi] - sums[lo]) / (hi - lo)


@dataclasses.dataclass(frozen=True)
class Curve:
    """One run's loss against tokens (as logged, and its monotone fit of the
    values averaged over ``smooth`` neighbours each side), and its training
    FLOPs per token (None: the cost model could not cost it)."""

    tokens: np.ndarray  # increasing
    raw: np.ndarray
    fit: np.ndarray
    flops_per_token: float | None = None

    @classmethod
    def of(cls, tokens: Sequence[float], loss: Sequence[float],
           flops_per_token: float | None = None, smooth: int = 0) -> Curve:
        order = np.argsort(np.asarray(tokens, dtype=np.float64), kind="stable")
        t = np.asarray(tokens, dtype=np.float64)[order]
        raw = np.asarray(loss, dtype=np.float64)[order]
        return cls(t, raw, monotone_fit(moving_mean(raw, smooth)), flops_per_token)

    @property
    def final_loss(self) -> float:
        return float(self.fit[-1])

    @property
    def final_tokens(self) -> float:
        return float(self.tokens[-1])

    @property
    def flops(self) -> np.ndarray | None:
        return None if self.flops_per_token is None else self.tokens * self.flops_per_token

    def axis(self, unit: str) -> np.ndarray | None:
        """The curve's x values in ``unit``: "tokens" or "flops"."""
        return self.tokens if unit == "tokens" else self.flops


@dataclasses.dataclass(frozen=True)
class Reach:
    """Where a fitted curve reaches a loss: ``tokens``, or None and ``why`` not."""

    tokens: float | None
    why: str = ""  # "" | NEVER | BEFORE_FIRST


NEVER = "never reaches it"
BEFORE_FIRST = "reached it before its first record"


def tokens_to_reach(curve: Curve, loss: float) -> Reach:
    """The last tokens at which ``curve``'s fit is still >= ``loss`` (linear
    between logged points).  The fit is non-increasing, so the points at or
    above ``loss`` are a prefix of the curve."""
    fit, t = curve.fit, curve.tokens
    if fit[-1] > loss:
        return Reach(None, NEVER)
    above = np.flatnonzero(fit >= loss)
    if above.size == 0:
        return Reach(None, BEFORE_FIRST)
    i = int(above[-1])
    if i == len(fit) - 1:
        return Reach(float(t[i]))
    frac = (fit[i] - loss) / (fit[i] - fit[i + 1])  # fit[i] >= loss > fit[i + 1]
    return Reach(float(t[i] + frac * (t[i + 1] - t[i])))


def loss_at(curve: Curve, budget: float, unit: str) -> float | None:
    """The fitted loss at ``budget`` tokens or FLOPs; None outside the curve."""
    x = curve.axis(unit)
    if x is None or not x[0] <= budget <= x[-1]:
        return None
    return float(np.interp(budget, x, curve.fit))


@dataclasses.dataclass(frozen=True)
class Speedup:
    """A run against a baseline at the same shape (None: not defined, ``note`` why)."""

    baseline_tokens: float | None  # the baseline's tokens to reach the run's final loss
    tokens: float | None  # baseline_tokens / the run's tokens
    flops: float | None  # the same in FLOPs
    reverse_tokens: float | None  # baseline's tokens / the run's tokens to its final loss
    reverse_flops: float | None
    note: str  # why ``tokens`` is None ("" when it is defined)


def _in_flops(ratio: float | None, numerator: Curve, denominator: Curve) -> float | None:
    """A ratio of tokens as the ratio of the FLOPs those tokens cost."""
    if ratio is None or numerator.flops_per_token is None or denominator.flops_per_token is None:
        return None
    return ratio * numerator.flops_per_token / denominator.flops_per_token


def speedup(run: Curve, baseline: Curve) -> Speedup:
    """How many times fewer tokens (FLOPs) ``run`` needs than ``baseline`` for
    its final loss: the baseline's tokens to reach it over the run's own."""
    reach = tokens_to_reach(baseline, run.final_loss)
    tokens = None if reach.tokens is None else reach.tokens / run.final_tokens
    back = tokens_to_reach(run, baseline.final_loss)
    reverse = None if not back.tokens else baseline.final_tokens / back.tokens
    return Speedup(reach.tokens, tokens, _in_flops(tokens, baseline, run), reverse,
                   _in_flops(reverse, baseline, run), reach.why)


def equal_budget(curves: Mapping[Hashable, Curve], unit: str
                 ) -> tuple[float | None, dict[Hashable, float | None]]:
    """(budget, {key: fitted loss at it}): the budget is the smallest total
    (tokens or FLOPs) of the curves, the most that every one of them reached.
    Curves that cannot be measured in ``unit`` are left out (loss None)."""
    ends = {k: c.axis(unit)[-1] for k, c in curves.items() if c.axis(unit) is not None}
    if not ends:
        return None, {k: None for k in curves}
    budget = float(min(ends.values()))
    return budget, {k: loss_at(c, budget, unit) for k, c in curves.items()}


def winner(losses: Mapping[Hashable, float | None]) -> Hashable | None:
    """The key with the lowest loss (None if none has one)."""
    known = {k: v for k, v in losses.items() if v is not None}
    return min(known, key=known.get) if known else None
