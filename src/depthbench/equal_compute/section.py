"""The sweep report's "Loss at equal compute" section and its results.csv columns.

Per finished run: its training FLOPs, its loss curve against tokens and FLOPs
(validation when every run was evaluated twice or more, else training), its
speedup over pre_ln's best run at the same shape, and per family each shape's
loss at the largest FLOPs budget all its shapes reached.  What each means:
docs/EQUAL_COMPUTE.md; the arithmetic: :mod:`.curves`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from etils import epath

from depthbench.equal_compute import curves as C
from depthbench.formatting import fmt_count
from depthbench.model.residual.protocol import registry
from depthbench.rundir.io import DamagedFile, finite, read_jsonl
from depthbench.rundir.names import METRICS_FILE

PLOT = "loss_vs_flops.png"
VALIDATION, TRAINING = "validation", "training"
MIN_VAL_POINTS = 2  # a validation curve with fewer points cannot be interpolated
# Training losses are one batch's each: averaged over this many logged
# neighbours on each side before the monotone fit (validation losses are not).
TRAINING_SMOOTHING = 2
COLUMNS = (  # appended to results.csv by the report, in this order
    "train_flops_per_token", "train_flops", "fitted_final_loss", "baseline_tokens_to_loss",
    "speedup_tokens", "speedup_flops", "reverse_speedup_tokens", "reverse_speedup_flops",
    "equal_flops_budget", "loss_at_equal_flops", "speedup_note",
)
FLOAT_COLUMNS = COLUMNS[:-1]


@dataclasses.dataclass(frozen=True)
class FamilyBudgets:
    """One family's best run per shape at equal FLOPs and at equal tokens."""

    suite: str
    family: str
    aspect_ratios: dict[int, float]  # depth -> aspect ratio, every shape of the suite
    flops_budget: float | None
    loss_at_flops: dict[int, float | None]  # depth -> fitted loss at the budget
    tokens_budget: float | None
    loss_at_tokens: dict[int, float | None]

    @property
    def best_depth_at_flops(self) -> int | None:
        return C.winner(self.loss_at_flops)

    @property
    def best_depth_at_tokens(self) -> int | None:
        return C.winner(self.loss_at_tokens)


@dataclasses.dataclass
class EqualCompute:
    kind: str  # VALIDATION | TRAINING | "" (no finished run has a curve)
    curves: dict[str, C.Curve]  # by run name
    columns: dict[str, dict]  # by run name: every name of COLUMNS -> its value
    families: list[FamilyBudgets]


def _finished(row: dict) -> bool:
    return not row.get("damage") and row["status"] == "done" and finite(row.get("final_val_loss"))


def _points(records: Sequence[dict], key: str, tokens_per_step: float | None
            ) -> dict[float, float]:
    """{tokens: loss} of the records holding ``key`` (a step logged twice keeps its last)."""
    out: dict[float, float] = {}
    for rec in records:
        if not (finite(rec.get(key)) and finite(rec.get("step"))):
            continue
        if finite(rec.get("tokens")):
            out[float(rec["tokens"])] = float(rec[key])
        elif tokens_per_step is not None:
            out[float(rec["step"]) * tokens_per_step] = float(rec[key])
    return out


def read_curves(workdir: epath.Path, rows: Sequence[dict],
                flops_per_token: Mapping[str, float]) -> tuple[str, dict[str, C.Curve]]:
    """(kind, {run name: curve}) of the finished runs: validation curves when every
    one was evaluated at two steps or more, else training curves."""
    points: dict[str, tuple[dict, dict]] = {}
    for row in filter(_finished, rows):
        try:
            records = read_jsonl(epath.Path(workdir) / row["name"] / METRICS_FILE)
        except DamagedFile:
            continue  # the report names the damaged log
        per_step = (row["tokens"] / row["steps"]) if row.get("tokens") and row.get("steps") \
            else None
        points[row["name"]] = (_points(records, "val_loss", per_step),
                               _points(records, "loss", per_step))
    logged = [p for p in points.values() if p[0] or p[1]]
    if not logged:
        return "", {}
    kind = VALIDATION if all(len(val) >= MIN_VAL_POINTS for val, _ in logged) else TRAINING
    out = {}
    for name, (val, train) in points.items():
        pts = val if kind == VALIDATION else train
        if pts:
            out[name] = C.Curve.of(list(pts), list(pts.values()), flops_per_token.get(name),
                                   smooth=0 if kind == VALIDATION else TRAINING_SMOOTHING)
    return kind, out


def _budgets(suite: str, family_row, curves: Mapping[str, C.Curve]) -> FamilyBudgets:
    by_depth = {c.depth: curves[c.name] for c in family_row.cells if c.name in curves}
    flops_budget, at_flops = C.equal_budget(by_depth, "flops")
    tokens_budget, at_tokens = C.equal_budget(by_depth, "tokens")
    return FamilyBudgets(suite, family_row.family,
                         {c.depth: c.aspect_ratio for c in family_row.cells},
                         flops_budget, at_flops, tokens_budget, at_tokens)


def _row_columns(row: dict, curve: C.Curve | None, fpt: float | None,
                 baseline: C.Curve | str, budgets: FamilyBudgets | None) -> dict:
    """The run's COLUMNS (``baseline``: the baseline's curve at its shape, or why none)."""
    out: dict = dict.fromkeys(COLUMNS)
    out["train_flops_per_token"] = fpt
    if fpt is not None and row.get("tokens") is not None:
        out["train_flops"] = fpt * float(row["tokens"])
    if curve is None:
        return out
    out["fitted_final_loss"] = curve.final_loss
    if isinstance(baseline, str):
        out["speedup_note"] = baseline
    else:
        s = C.speedup(curve, baseline)
        out.update(baseline_tokens_to_loss=s.baseline_tokens, speedup_tokens=s.tokens,
                   speedup_flops=s.flops, reverse_speedup_tokens=s.reverse_tokens,
                   reverse_speedup_flops=s.reverse_flops,
                   speedup_note=f"{registry.baseline()} {s.note}" if s.note else None)
    if budgets is not None and budgets.flops_budget is not None:
        out["equal_flops_budget"] = budgets.flops_budget
        out["loss_at_equal_flops"] = C.loss_at(curve, budgets.flops_budget, "flops")
    return out


def analyse(workdir: epath.Path, rows: Sequence[dict], summary: Mapping[str, Sequence],
            flops_per_token: Mapping[str, float]) -> EqualCompute:
    """Everything the section shows, from the report's rows and summary
    (``{suite: [FamilyRow]}``) and each run's train FLOPs per token (by name)."""
    kind, curves = read_curves(workdir, rows, flops_per_token)
    families, baselines, base = [], {}, registry.baseline()
    for suite, family_rows in summary.items():
        for fr in family_rows:
            families.append(_budgets(suite, fr, curves))
            if fr.family == base:
                baselines[suite] = {c.depth: curves.get(c.name, f"no {base} curve at this "
                                                    "shape") for c in fr.cells if c.name}
    by_family = {(b.suite, b.family): b for b in families}
    columns = {}
    for row in rows:
        suite = row.get("suite") or ""
        reference = baselines.get(suite, {}).get(int(row["depth"]),
                                                 f"no finished {base} run at this shape")
        columns[row["name"]] = _row_columns(
            row, curves.get(row["name"]) if _finished(row) else None,
            flops_per_token.get(row["name"]), reference, by_family.get((suite, row["family"])))
    return EqualCompute(kind, curves, columns, families)


def _num(x: float | None, fmt: str = "{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def _reach(cols: dict) -> str:
    if cols["baseline_tokens_to_loss"] is not None:
        return fmt_count(cols["baseline_tokens_to_loss"])
    note = cols["speedup_note"] or ""
    return note.removeprefix(f"{registry.baseline()} ") if note else "-"


def runs_table(ec: EqualCompute, rows: Sequence[dict], summary: Mapping[str, Sequence]
               ) -> tuple[list[str], list[list[str]]]:
    """One row per (suite, family, shape): its best learning rate's run."""
    headers = ["family", "L", "AR", "train FLOPs", "FLOPs/token", "wall s", "tokens/s",
               "final loss (fit)", f"{registry.baseline()} tokens to reach it", "speedup tokens",
               "speedup FLOPs", "reverse speedup tokens / FLOPs"]
    by_name = {r["name"]: r for r in rows}
    body = []
    for family_rows in summary.values():
        for fr in family_rows:
            for cell in fr.cells:
                if cell.name is None:
                    continue
                row, cols = by_name[cell.name], ec.columns[cell.name]
                rev = (cols["reverse_speedup_tokens"], cols["reverse_speedup_flops"])
                body.append([
                    fr.family, str(cell.depth), f"{cell.aspect_ratio:.1f}",
                    _num(cols["train_flops"], "{:.2e}"),
                    _num(cols["train_flops_per_token"], "{:.2e}"),
                    _num(row.get("wall_seconds"), "{:,.1f}"),
                    _num(row.get("tokens_per_sec"), "{:,.0f}"),
                    _num(cols["fitted_final_loss"], "{:.4f}"), _reach(cols),
                    _num(cols["speedup_tokens"], "{:.2f}"), _num(cols["speedup_flops"], "{:.2f}"),
                    "-" if rev[0] is None else f"{rev[0]:.2f} / {_num(rev[1], '{:.2f}')}",
                ])
    return headers, body


def budgets_table(families: Sequence[FamilyBudgets]) -> tuple[list[str], list[list[str]]]:
    """Per family: loss at the equal-FLOPs budget per shape, and both winners."""
    depths = sorted({d for b in families for d in b.aspect_ratios})
    ars = {d: ar for b in families for d, ar in b.aspect_ratios.items()}
    headers = ["family"] + [f"AR {ars[d]:.1f} (L{d})" for d in depths] + [
        "FLOPs budget", "best AR, equal FLOPs", "best AR, equal tokens"]
    body = []
    for b in families:
        if b.flops_budget is None:
            continue
        best = b.best_depth_at_flops
        cells = []
        for d in depths:
            loss = b.loss_at_flops.get(d)
            text = _num(loss, "{:.4f}")
            cells.append(f"**{text}**" if d == best else text)
        tok = b.best_depth_at_tokens
        body.append([b.family] + cells + [
            _num(b.flops_budget, "{:.2e}"), "-" if best is None else f"{ars[best]:.1f}",
            "-" if tok is None else f"{ars[tok]:.1f}"])
    return headers, body


def _intro(kind: str) -> list[str]:
    base = registry.baseline()
    curve = ("validation loss (every finished run was evaluated at two steps or more)"
             if kind == VALIDATION else
             "training loss, as logged every `train.log_every` steps, each averaged with "
             f"up to {TRAINING_SMOOTHING} logged neighbours on each side (some finished run "
             f"was evaluated at fewer than {MIN_VAL_POINTS} steps, so validation curves "
             "cannot be interpolated)")
    return [
        "Training FLOPs: the cost model's forward + backward FLOPs per token "
        "(`depthbench.costs.train_flops_per_token`: weight matmuls and LM head x 6, causal "
        "attention, the family's own work x 3) times the tokens trained.  "
        f"Curves: {curve}, made monotone by a least-squares non-increasing fit so that one "
        "noisy record never decides where a curve crosses a loss.  "
        f"Speedup: the tokens (FLOPs) the best {base} run at the same shape needs to "
        "reach the run's final fitted loss, over the run's own; when "
        f"{base} never reaches it, the reverse speedup measures the other way "
        f"({base}'s tokens over the run's tokens to reach {base}'s final loss).  "
        "Each row is the best learning rate's run; results.csv has these columns for every "
        "run.", ""]


def markdown_lines(ec: EqualCompute, rows: Sequence[dict], summary: Mapping[str, Sequence],
                   md_table: Callable, plot_file: str | None, plot_why: str = "") -> list[str]:
    """The section's markdown lines."""
    lines = ["## Loss at equal compute", ""]
    if not ec.kind:
        return lines + ["*No finished run has a loss curve (`metrics.jsonl`): nothing to "
                        "compare at equal compute.*", ""]
    lines += _intro(ec.kind)
    lines += [md_table(*runs_table(ec, rows, summary), align="l"), ""]
    for suite in dict.fromkeys(b.suite for b in ec.families):
        families = [b for b in ec.families if b.suite == suite]
        headers, body = budgets_table(families)
        if not body:
            continue
        title = f"suite `{suite}`" if suite else "shape rule"
        lines += [f"### Aspect ratio at equal FLOPs, {title}", "",
                  "Each shape's fitted loss at the family's FLOPs budget: the smallest "
                  "total training FLOPs of its shapes, which all of them reached (**bold**: "
                  "the best).  \"Best AR, equal tokens\" compares the same curves at the "
                  "smallest total tokens instead.", ""]
        lines += [md_table(headers, body, align="l"), ""]
        changed = [b.family for b in families if b.best_depth_at_flops is not None
                   and b.best_depth_at_flops != b.best_depth_at_tokens]
        lines += [("The winning aspect ratio changes when FLOPs are charged for: "
                   + ", ".join(f"`{f}`" for f in changed) + ".") if changed else
                  "No family's winning aspect ratio changes when FLOPs are charged.", ""]
    caption = f"{ec.kind.capitalize()} loss vs training FLOPs (best learning rate per shape)"
    if plot_file:
        lines += [f"![{caption}]({plot_file})", "", f"*{caption}; dotted: the family's "
                  "equal-FLOPs budget, star: the shape that wins at it.*", ""]
    else:
        lines += [f"*{caption}: not drawn ({plot_why or 'no data'}).*", ""]
    return lines


def draw(ec: EqualCompute, summary: Mapping[str, Sequence], path: epath.Path) -> bool:
    """The section's plot (:func:`depthbench.plots.loss_vs_flops`) of every
    shape's best run; False when no such run has both a curve and a cost."""
    from depthbench import plots

    drawn, budgets = [], {}
    for b in ec.families:
        best = b.best_depth_at_flops
        budgets[b.suite, b.family] = (b.flops_budget, best, b.loss_at_flops.get(best))
    for suite, family_rows in summary.items():
        for fr in family_rows:
            for cell in fr.cells:
                curve = ec.curves.get(cell.name)
                if curve is not None and curve.flops is not None:
                    drawn.append({"suite": suite, "family": fr.family, "depth": cell.depth,
                                  "aspect_ratio": cell.aspect_ratio, "flops": curve.flops,
                                  "raw": curve.raw, "fit": curve.fit})
    return plots.loss_vs_flops(drawn, budgets, path, f"{ec.kind} loss (nats/token)")


def summary_json(ec: EqualCompute) -> dict:
    """The section's numbers for `depthbench report --json`."""
    return {
        "curve": ec.kind,
        "runs": ec.columns,
        "families": [{"suite": b.suite, "family": b.family, "flops_budget": b.flops_budget,
                      "loss_at_equal_flops": b.loss_at_flops,
                      "best_depth_at_equal_flops": b.best_depth_at_flops,
                      "best_depth_at_equal_tokens": b.best_depth_at_tokens}
                     for b in ec.families],
    }
