"""The best run of each (suite, family, depth) and each family's best aspect ratio."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from depthbench.report.rows import shown_status
from depthbench.rundir.io import finite


@dataclasses.dataclass(frozen=True)
class Cell:
    """The best run of one (suite, family, depth): its lr and loss, or why none."""

    depth: int
    aspect_ratio: float
    loss: float | None  # None: no finished, finite run
    lr: float | None
    name: str | None
    state: str  # "ok" | "diverged" (every lr) | "pending" | "failed" | "damaged"


@dataclasses.dataclass(frozen=True)
class FamilyRow:
    suite: str
    family: str
    cells: tuple[Cell, ...]  # one per depth of the suite's sweep, deepest last

    @property
    def best(self) -> Cell | None:
        ok = [c for c in self.cells if c.loss is not None]
        return min(ok, key=lambda c: c.loss) if ok else None


def summarize(rows: Sequence[dict]) -> dict[str, list[FamilyRow]]:
    """``{suite: [FamilyRow, ...]}``: per family the best lr per shape, the loss
    at each aspect ratio and the best aspect ratio (families in sweep order)."""
    suites: dict[str, dict[str, dict[int, list[dict]]]] = {}
    ars: dict[str, dict[int, float]] = {}
    for row in rows:
        suite = row.get("suite") or ""
        suites.setdefault(suite, {}).setdefault(row["family"], {}).setdefault(
            int(row["depth"]), []).append(row)
        ars.setdefault(suite, {})[int(row["depth"])] = float(row["aspect_ratio"])
    out: dict[str, list[FamilyRow]] = {}
    for suite, families in suites.items():
        depths = sorted(ars[suite])
        table = []
        for family, by_depth in families.items():
            cells = []
            for depth in depths:
                runs = by_depth.get(depth, [])
                good = [r for r in runs
                        if shown_status(r) == "done" and finite(r["final_val_loss"])]
                if good:
                    best = min(good, key=lambda r: r["final_val_loss"])
                    cells.append(Cell(depth, ars[suite][depth], best["final_val_loss"],
                                      best["lr"], best["name"], "ok"))
                    continue
                if runs and all(shown_status(r) == "diverged" or (
                        shown_status(r) == "done" and not finite(r["final_val_loss"]))
                                for r in runs):
                    state = "diverged"
                elif any(shown_status(r) == "damaged" for r in runs):
                    state = "damaged"
                elif any(shown_status(r) == "failed" for r in runs):
                    state = "failed"
                else:
                    state = "pending"
                cells.append(Cell(depth, ars[suite][depth], None, None, None, state))
            table.append(FamilyRow(suite, family, tuple(cells)))
        out[suite] = table
    return out
