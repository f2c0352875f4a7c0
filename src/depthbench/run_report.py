"""`depthbench report RUN_DIR` for one training run: summary, curves, per-block statistics.

Writes ``report.md``, ``loss_curves.png`` and ``layer_stats.png`` into the run
directory (docs/RUNS.md).  A damaged record is named, never shown as if whole,
and is one warning in :attr:`RunReport.warnings`."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from depthbench.errors import ConfigError
from depthbench.rundir import io, restore
from depthbench.rundir.names import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    LAYER_STATS_FILE,
    LAYER_STATS_PLOT,
    LOSS_CURVES_PLOT,
    MANIFEST,
    METRICS_FILE,
    REPORT_FILE,
    RESULT_FILE,
)


def is_run_dir(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() and not (path / MANIFEST).exists()


def _rows(path: Path, damage: list[io.DamagedFile]) -> list[dict]:
    """A JSON-lines log's rows; a damaged log's rows before the damage (named in ``damage``)."""
    try:
        return io.read_jsonl(path)
    except io.DamagedFile as e:
        damage.append(e)
        return e.rows


def layer_stats(run_dir: Path, damage: list[io.DamagedFile] | None = None
                ) -> dict[str, dict[int, list[float]]]:
    """{stat: {step: [value per index]}} from the run's layer_stats.jsonl
    (a value recorded as null, a NaN, reads as NaN)."""
    out: dict[str, dict[int, list[float]]] = {}
    for row in _rows(run_dir / LAYER_STATS_FILE, [] if damage is None else damage):
        for stat, values in row.items():
            if stat != "step" and isinstance(values, list):
                out.setdefault(stat, {})[int(row["step"])] = [
                    math.nan if v is None else float(v) for v in values]
    return out


def loss_curves(rows: list[dict], path: Path, title: str) -> bool:
    """Loss (train line, validation dots), learning rate and gradient norm vs step."""
    from depthbench.plots import Figure, save_figure

    train = [(r["step"], r["loss"]) for r in rows if io.finite(r.get("loss"))]
    if not train:
        return False
    fig = Figure(figsize=(11, 3.4))
    ax_loss, ax_lr, ax_gn = fig.subplots(1, 3)
    dots = "." if len(train) < 30 else None  # a short run's few points stay visible
    ax_loss.plot(*zip(*train, strict=True), lw=1.2, marker=dots, label="train")
    val = [(r["step"], r["val_loss"]) for r in rows if io.finite(r.get("val_loss"))]
    if val:
        ax_loss.plot(*zip(*val, strict=True), "o", ms=4, label="validation")
    ax_loss.set(xlabel="step", ylabel="loss (nats/token)", title=title)
    ax_loss.legend(frameon=False)
    for ax, key, label in ((ax_lr, "lr", "learning rate"), (ax_gn, "grad_norm", "gradient norm")):
        points = [(r["step"], r[key]) for r in rows if io.finite(r.get(key))]
        if points:
            ax.plot(*zip(*points, strict=True), lw=1.2, marker=dots)
        ax.set(xlabel="step", ylabel=label)
    fig.tight_layout()
    save_figure(fig, path)
    return True


# The statistics drawn (the others of layer_stats.jsonl, the original's mean,
# variance and magnitude of both directions, are in report.md's table, TensorBoard, W&B).
PLOTTED = ("state_rms", "update_rms", "update_ratio", "forward_norm", "backward_norm")


def layer_plot(stats: dict[str, dict[int, list[float]]], path: Path, title: str) -> bool:
    """One panel per statistic of :data:`PLOTTED` the run logged: value vs block
    index, a line per logged step (light = early, dark = late)."""
    from matplotlib import colormaps
    from matplotlib.ticker import MaxNLocator

    from depthbench.plots import Figure, save_figure

    stats = {name: stats[name] for name in PLOTTED if name in stats}
    if not stats:
        return False
    fig = Figure(figsize=(4.2 * len(stats), 3.4))
    axes = fig.subplots(1, len(stats), squeeze=False)[0]
    cmap = colormaps["viridis"]
    for ax, (stat, by_step) in zip(axes, stats.items(), strict=True):
        steps = sorted(by_step)
        for k, step in enumerate(steps):
            shade = cmap(0.15 + 0.8 * k / max(1, len(steps) - 1))
            ax.plot(range(len(by_step[step])), by_step[step], marker=".", color=shade,
                    label=f"step {step}" if k in (0, len(steps) - 1) else None)
        ax.set(xlabel="depth state" if stat == "state_rms" else "block", ylabel=stat,
               yscale="log" if all(v > 0 for s in steps for v in by_step[s]) else "linear")
        if stat == "backward_norm" and all(math.isnan(v) for s in steps for v in by_step[s]):
            ax.set_title("no gradient: the depth state is a mix", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(frameon=False, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)
    return True


@dataclasses.dataclass
class RunReport:
    text: str  # report.md
    files: dict[str, str]  # what -> path
    layer_stats: dict[str, dict[int, list[float]]]
    warnings: list[str] = dataclasses.field(default_factory=list)  # one line each


@dataclasses.dataclass(frozen=True)
class _Checkpoints:
    """What the run's checkpoints hold: the step it would resume from (None:
    no checkpoint), the damaged steps skipped, or why none is intact."""

    step: int | None
    skipped: str = ""
    none_intact: str = ""

    @classmethod
    def of(cls, run_dir: Path) -> _Checkpoints:
        try:
            found = restore.newest_intact(run_dir / CHECKPOINT_DIR,
                                          hint="the run cannot resume from them")
        except restore.DamagedCheckpoints as e:
            return cls(None, none_intact=str(e))
        if found is None:
            return cls(None)
        return cls(found.step, found.skipped_text())

    def warning(self, run_dir: Path) -> str | None:
        if self.none_intact:
            return self.none_intact
        if self.skipped:
            return (f"skipped damaged checkpoint(s) in {run_dir / CHECKPOINT_DIR} "
                    f"({self.skipped}); newest intact: step {self.step}")
        return None


def _progress(config: dict, rows: list[dict], ckpts: _Checkpoints) -> str:
    steps = int(config.get("train", {}).get("steps", 0))
    last = rows[-1]["step"] if rows else 0
    if ckpts.none_intact:
        resume = "; no checkpoint is intact, it cannot resume (see the damaged files below)"
    elif ckpts.step is not None:
        resume = f"; resumes from step {ckpts.step}"
    else:
        resume = ""
    return (f"not finished: step {last} of {steps} logged{resume} (re-run the same `train` "
            "command to continue)")


def _outcome(config: dict, result: dict | None, result_damage: io.DamagedFile | None,
             rows: list[dict], ckpts: _Checkpoints, run_dir: Path) -> str:
    """The summary block: the end-of-run summary, or why there is none."""
    from depthbench.train.summary import summary

    if result_damage is not None:
        return (f"outcome unknown: {RESULT_FILE} {result_damage.reason} (delete it and re-run "
                "the same `train` command to finish the run again from its last checkpoint)")
    return summary(result, run_dir) if result else _progress(config, rows, ckpts)


def _read(run_dir: Path) -> tuple[dict, dict | None, list[io.DamagedFile]]:
    """config.json (required), result.json (None: not ended or damaged) and the damage found."""
    try:
        config = io.read_json(run_dir / CONFIG_FILE)
    except io.DamagedFile as e:
        raise ConfigError(f"report: {e}") from None
    if config is None:
        raise ConfigError(f"report: {str(run_dir / CONFIG_FILE)!r} is missing or unreadable")
    damage: list[io.DamagedFile] = []
    try:
        result = io.read_json(run_dir / RESULT_FILE)
    except io.DamagedFile as e:
        damage.append(e)
        result = None
    return config, result, damage


def build(run_dir: str | Path, *, plots: bool = True) -> RunReport:
    """Write report.md (and, with ``plots``, the PNGs) into ``run_dir``."""
    run_dir = Path(run_dir)
    config, result, damage = _read(run_dir)
    result_damage = damage[0] if damage else None
    rows = _rows(run_dir / METRICS_FILE, damage)
    stats = layer_stats(run_dir, damage)
    ckpts = _Checkpoints.of(run_dir)
    shape = config.get("resolved", {}).get("shape", {})
    family = config.get("model", {}).get("family", "?")
    title = f"{family} L{shape.get('depth', '?')} d{shape.get('d_model', '?')}"
    files: dict[str, str] = {}
    if plots:
        if loss_curves(rows, run_dir / LOSS_CURVES_PLOT, title):
            files["loss_curves"] = str(run_dir / LOSS_CURVES_PLOT)
        if layer_plot(stats, run_dir / LAYER_STATS_PLOT, title):
            files["layer_stats"] = str(run_dir / LAYER_STATS_PLOT)
    lines = [f"# Run {run_dir.name}: {title}", "", "```text",
             _outcome(config, result, result_damage, rows, ckpts, run_dir), "```", ""]
    lines += _damage_lines(damage, ckpts, run_dir)
    lines += _evaluation_lines(rows)
    if "loss_curves" in files:
        lines += [f"![loss, learning rate and gradient norm]({LOSS_CURVES_PLOT})", ""]
    lines += _stats_lines(stats, "layer_stats" in files)
    text = "\n".join(lines)
    io.atomic_write(run_dir / REPORT_FILE, text)  # never half a report
    files["report"] = str(run_dir / REPORT_FILE)
    warnings = [str(d) for d in damage]
    if ckpts.warning(run_dir):
        warnings.append(ckpts.warning(run_dir))
    return RunReport(text, files, stats, warnings)


def _damage_lines(damage: list[io.DamagedFile], ckpts: _Checkpoints, run_dir: Path
                  ) -> list[str]:
    notes = [f"- `{Path(str(d.path)).name}` {d.reason}" for d in damage]
    if ckpts.warning(run_dir):
        notes.append(f"- `{CHECKPOINT_DIR}/`: {ckpts.warning(run_dir)}")
    if not notes:
        return []
    logs = any(str(d.path).endswith(".jsonl") for d in damage)
    intro = ["Logs are shown up to their damaged line.", ""] if logs else []
    return ["## Damaged files", "", *intro, *notes, ""]


def _evaluation_lines(rows: list[dict]) -> list[str]:
    evals = [r for r in rows if io.finite(r.get("val_loss"))]
    if not evals:
        return []
    lines = ["## Evaluations", "", "| step | tokens | train loss | validation loss |",
             "| ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['step']} | {r.get('tokens', '')} | {r.get('loss', float('nan')):.4f} | "
              f"{r['val_loss']:.4f} |" for r in evals]
    return [*lines, ""]


def _stats_lines(stats: dict[str, dict[int, list[float]]], plotted: bool) -> list[str]:
    lines = ["## Per-block residual-stream statistics", ""]
    if not stats:
        return lines + [f"none in {LAYER_STATS_FILE} (train.layer_stats_every = 0, no step "
                        "reached it yet, or a run trained before that file was kept: its "
                        "statistics are in TensorBoard only)", ""]
    last = {stat: max(by_step) for stat, by_step in stats.items()}
    width = max(len(v) for stat in stats for v in stats[stat].values())
    lines += ["At the last logged step (index: depth state for state_rms, block for the "
              "others):", "",
              "| statistic | step | " + " | ".join(str(i) for i in range(width)) + " |",
              "| :--- | ---: | " + " | ".join("---:" for _ in range(width)) + " |"]
    for stat in sorted(stats):
        vals = stats[stat][last[stat]]
        cells = [f"{v:.4g}" for v in vals] + [""] * (width - len(vals))
        lines.append(f"| {stat} | {last[stat]} | " + " | ".join(cells) + " |")
    lines.append("")
    if plotted:
        lines += [f"![per-block statistics over training]({LAYER_STATS_PLOT})", ""]
    return lines
