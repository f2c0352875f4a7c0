"""Does the best learning rate carry across depth?  A sweep's transfer verdicts
and the report's section "Learning rate across depth".

For every (suite, family) that tried two rates or more at two depths or more:
the best rate per depth, the grid steps between the shallowest's and the
deepest's, the loss cost of reusing, and the verdict; the rule is in
docs/LR_TRANSFER.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from depthbench.formatting import fmt_lr
from depthbench.rundir.io import finite
from depthbench.sweep.transfer import count_runs

TOLERANCE = 1  # grid steps between the two bests that still count as the same rate
VERDICTS = ("transfers", "does not transfer", "incomplete")


def _usable(row: dict) -> bool:
    return row.get("status") == "done" and not row.get("damage") and finite(
        row.get("final_val_loss"))


def _finished(row: dict) -> bool:
    return row.get("status") in ("done", "diverged") and not row.get("damage")


@dataclasses.dataclass(frozen=True)
class Transfer:
    """The verdict of one (suite, family)."""

    suite: str
    family: str
    grid: tuple[float, ...]  # every rate the family tried, ascending
    best: tuple[tuple[int, float | None], ...]  # (depth, best rate or None), shallow first
    steps_apart: int | None  # grid steps between the shallowest and deepest bests
    cost: float | None  # loss at the deepest with the shallowest's best, minus its own best
    cost_note: str  # "" when ``cost`` is a number; else why not ("diverged", "not run")
    edge: bool  # a best at either end of the grid
    verdict: str  # one of VERDICTS

    @property
    def shallow(self) -> int:
        return self.best[0][0]

    @property
    def deep(self) -> int:
        return self.best[-1][0]


def _best(runs: Sequence[dict]) -> float | None:
    ok = [r for r in runs if _usable(r)]
    return float(min(ok, key=lambda r: r["final_val_loss"])["lr"]) if ok else None


def verdict(suite: str, family: str, rows: Sequence[dict]) -> Transfer | None:
    """The transfer verdict of one family's rows (None: fewer than two rates or depths)."""
    grid = tuple(sorted({float(r["lr"]) for r in rows}))
    depths = sorted({int(r["depth"]) for r in rows})
    if len(grid) < 2 or len(depths) < 2:
        return None
    at = {d: [r for r in rows if int(r["depth"]) == d] for d in depths}
    best = tuple((d, _best(at[d])) for d in depths)
    lo, hi = best[0][1], best[-1][1]
    complete = all(_finished(r) for d in (depths[0], depths[-1]) for r in at[d])
    if lo is None or hi is None or not complete:
        return Transfer(suite, family, grid, best, None, None, "", False, "incomplete")
    apart = abs(grid.index(lo) - grid.index(hi))
    edge = any(lr in (grid[0], grid[-1]) for lr in (lo, hi))
    reused = [r for r in at[depths[-1]] if float(r["lr"]) == lo]
    cost, note = None, "not run"
    if reused and _usable(reused[0]):
        own = min(r["final_val_loss"] for r in at[depths[-1]] if _usable(r))
        cost, note = float(reused[0]["final_val_loss"]) - float(own), ""
    elif reused:
        note = "diverged"
    carries = apart <= TOLERANCE and note != "diverged"
    return Transfer(suite, family, grid, best, apart, cost, note, edge,
                    "transfers" if carries else "does not transfer")


def verdicts(rows: Sequence[dict]) -> list[Transfer]:
    """Every (suite, family) with a verdict, in the rows' order."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row.get("suite") or "", str(row["family"])), []).append(row)
    found = (verdict(suite, family, runs) for (suite, family), runs in groups.items())
    return [v for v in found if v is not None]


HEADERS = ("family", "rates tried", "best rate by depth", "grid steps apart",
           "loss cost of reusing", "verdict")


def _row(v: Transfer) -> list[str]:
    by_depth = ", ".join(f"L{d} {fmt_lr(lr) if lr is not None else '-'}" for d, lr in v.best)
    cost = f"{v.cost:+.4f}" if v.cost is not None else (v.cost_note or "-")
    apart = "-" if v.steps_apart is None else str(v.steps_apart)
    label = v.verdict + (" (a best at the grid's edge)" if v.edge else "")
    return [v.family, ", ".join(fmt_lr(lr) for lr in v.grid), by_depth, apart,
            f"{cost} at L{v.deep}" if v.steps_apart is not None else "-", label]


def markdown_lines(rows: Sequence[dict], md_table: Callable[..., str]) -> list[str]:
    """The report's section (none when no family tried two rates at two depths)."""
    found = verdicts(rows)
    if not found:
        return []
    out = ["## Learning rate across depth", "",
           "Per family, the best learning rate (lowest final validation loss) at each depth; "
           f"it *transfers* when the best at the shallowest depth is within {TOLERANCE} step "
           "of the grid of the best at the deepest (and the deepest does not diverge at it).  "
           "The loss cost is what training the deepest shape at the shallowest shape's best "
           "rate gives up against its own best.  "
           "`+lr_rule` rows train under the family's own learning-rate rule.", ""]
    for suite in dict.fromkeys(v.suite for v in found):
        mine = [v for v in found if v.suite == suite]
        if len(found) != len(mine):
            out += [f"### Suite `{suite or 'shape rule'}`", ""]
        out += [md_table(HEADERS, [_row(v) for v in mine], align="lll"), ""]
        safe = [v.family for v in mine if v.verdict == "transfers"]
        unsafe = [v.family for v in mine if v.verdict == "does not transfer"]
        out += [f"Transfers: {', '.join(safe) or 'none'}.  Does not: "
                f"{', '.join(unsafe) or 'none'}.", ""]
        tuned = [r for r in rows if (r.get("suite") or "") == suite and
                 str(r["family"]) in {v.family for v in mine}]
        full, planned = count_runs(((r["family"], int(r["depth"])) for r in tuned), None)
        out += [f"Tuning each family's rate at its shallowest depth only and reusing it "
                f"(`depthbench sweep --transfer-lr-from L`) would train {planned} of these "
                f"{full} runs.", ""]
    return out
