"""`depthbench report RUN_DIR` for one training run: summary, curves, per-block statistics.

A run directory (``depthbench train --workdir``) holds ``config.json``,
``metrics.jsonl``, TensorBoard events under ``tb/`` and, once ended,
``result.json``.  The report writes into it:

* ``report.md``: the end-of-run summary (or how far an unfinished run got),
  the loss table at every evaluation, and the per-block statistics at the
  last step they were logged;
* ``loss_curves.png``: training loss (and validation loss at evaluations),
  learning rate and gradient norm against the step;
* ``layer_stats.png``: the residual stream's per-block statistics over
  training (``state_rms``, ``update_rms``, ``update_ratio``; see
  ``train/step.py:layer_stats``), one line per logged step, read from the
  TensorBoard events (``layers/<stat>/<index>``) the trainer writes every
  ``train.layer_stats_every`` steps.

Events are read with tensorboardX's protobuf (no TensorFlow/TensorBoard
needed); a resumed run's purge marker drops what an interrupted session
logged after its last checkpoint, as TensorBoard itself does.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path

from depthbench.errors import ConfigError

CONFIG_FILE, RESULT_FILE, METRICS_FILE, TB_DIR = "config.json", "result.json", "metrics.jsonl", "tb"
LAYER_PREFIX = "layers/"


def is_run_dir(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() and not (path / "sweep.json").exists()


# --------------------------------------------------------------- reading


def _records(path: Path) -> Iterator[bytes]:
    """TFRecord payloads: u64 length, u32 crc, payload, u32 crc (a torn tail is dropped)."""
    data = path.read_bytes()
    at = 0
    while at + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, at)
        if at + 12 + n + 4 > len(data):
            return
        yield data[at + 12: at + 12 + n]
        at += 12 + n + 4


def layer_stats(run_dir: Path) -> dict[str, dict[int, list[float]]]:
    """{stat: {step: [value per index]}} from the run's TensorBoard events."""
    from tensorboardX.proto import event_pb2

    values: dict[tuple[str, int], dict[int, float]] = {}  # (stat, step) -> {index: value}
    for path in sorted((run_dir / TB_DIR).glob("events.out.tfevents.*")):
        for payload in _records(path):
            event = event_pb2.Event.FromString(payload)
            if event.HasField("session_log") and event.session_log.status == 1:  # START
                values = {k: v for k, v in values.items() if k[1] < event.step}
                continue
            for value in event.summary.value:
                if not value.tag.startswith(LAYER_PREFIX):
                    continue
                stat, _, index = value.tag[len(LAYER_PREFIX):].rpartition("/")
                if stat and index.isdigit():
                    values.setdefault((stat, int(event.step)), {})[int(index)] = value.simple_value
    out: dict[str, dict[int, list[float]]] = {}
    for (stat, step), by_index in sorted(values.items()):
        out.setdefault(stat, {})[step] = [by_index[i] for i in sorted(by_index)]
    return out


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _metrics(run_dir: Path) -> list[dict]:
    from depthbench.train.metrics import read_jsonl

    return read_jsonl(run_dir / METRICS_FILE)


# ------------------------------------------------------------------ plots


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def loss_curves(rows: list[dict], path: Path, title: str) -> bool:
    """Loss (train line, validation dots), learning rate and gradient norm vs step."""
    from depthbench.plots import Figure, _save

    train = [(r["step"], r["loss"]) for r in rows if _finite(r.get("loss"))]
    if not train:
        return False
    fig = Figure(figsize=(11, 3.4))
    ax_loss, ax_lr, ax_gn = fig.subplots(1, 3)
    dots = "." if len(train) < 30 else None  # a short run's few points stay visible
    ax_loss.plot(*zip(*train, strict=True), lw=1.2, marker=dots, label="train")
    val = [(r["step"], r["val_loss"]) for r in rows if _finite(r.get("val_loss"))]
    if val:
        ax_loss.plot(*zip(*val, strict=True), "o", ms=4, label="validation")
    ax_loss.set(xlabel="step", ylabel="loss (nats/token)", title=title)
    ax_loss.legend(frameon=False)
    for ax, key, label in ((ax_lr, "lr", "learning rate"), (ax_gn, "grad_norm", "gradient norm")):
        points = [(r["step"], r[key]) for r in rows if _finite(r.get(key))]
        if points:
            ax.plot(*zip(*points, strict=True), lw=1.2, marker=dots)
        ax.set(xlabel="step", ylabel=label)
    fig.tight_layout()
    _save(fig, path)
    return True


def layer_plot(stats: dict[str, dict[int, list[float]]], path: Path, title: str) -> bool:
    """One panel per statistic: value vs block index, a line per logged step
    (light = early, dark = late)."""
    from matplotlib import colormaps
    from matplotlib.ticker import MaxNLocator

    from depthbench.plots import Figure, _save

    if not stats:
        return False
    fig = Figure(figsize=(4.2 * len(stats), 3.4))
    axes = fig.subplots(1, len(stats), squeeze=False)[0]
    cmap = colormaps["viridis"]
    for ax, (stat, by_step) in zip(axes, sorted(stats.items()), strict=True):
        steps = sorted(by_step)
        for k, step in enumerate(steps):
            shade = cmap(0.15 + 0.8 * k / max(1, len(steps) - 1))
            ax.plot(range(len(by_step[step])), by_step[step], marker=".", color=shade,
                    label=f"step {step}" if k in (0, len(steps) - 1) else None)
        ax.set(xlabel="depth state" if stat == "state_rms" else "block", ylabel=stat,
               yscale="log" if all(v > 0 for s in steps for v in by_step[s]) else "linear")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(frameon=False, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    _save(fig, path)
    return True


# ----------------------------------------------------------------- report


@dataclasses.dataclass
class RunReport:
    text: str  # report.md
    files: dict[str, str]  # what -> path
    layer_stats: dict[str, dict[int, list[float]]]


def _progress(config: dict, rows: list[dict], run_dir: Path) -> str:
    steps = int(config.get("train", {}).get("steps", 0))
    last = rows[-1]["step"] if rows else 0
    ckpts = sorted(int(p.name) for p in (run_dir / "checkpoints").glob("*") if p.name.isdigit())
    resume = f"; resumes from step {ckpts[-1]}" if ckpts else ""
    return (f"not finished: step {last} of {steps} logged{resume} (re-run the same `train` "
            "command to continue)")


def build(run_dir: str | Path, *, plots: bool = True) -> RunReport:
    """Write report.md (and, with ``plots``, the PNGs) into ``run_dir``."""
    from depthbench.train.summary import summary

    run_dir = Path(run_dir)
    config = _read_json(run_dir / CONFIG_FILE)
    if config is None:
        raise ConfigError(f"report: {str(run_dir / CONFIG_FILE)!r} is missing or unreadable")
    result = _read_json(run_dir / RESULT_FILE)
    rows = _metrics(run_dir)
    stats = layer_stats(run_dir) if (run_dir / TB_DIR).is_dir() else {}
    shape = config.get("resolved", {}).get("shape", {})
    family = config.get("model", {}).get("family", "?")
    title = f"{family} L{shape.get('depth', '?')} d{shape.get('d_model', '?')}"
    files: dict[str, str] = {}
    if plots:
        if loss_curves(rows, run_dir / "loss_curves.png", title):
            files["loss_curves"] = str(run_dir / "loss_curves.png")
        if layer_plot(stats, run_dir / "layer_stats.png", title):
            files["layer_stats"] = str(run_dir / "layer_stats.png")
    lines = [f"# Run {run_dir.name}: {title}", "", "```text"]
    lines.append(summary(result, run_dir) if result else _progress(config, rows, run_dir))
    lines += ["```", ""]
    evals = [r for r in rows if _finite(r.get("val_loss"))]
    if evals:
        lines += ["## Evaluations", "", "| step | tokens | train loss | validation loss |",
                  "| ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['step']} | {r.get('tokens', '')} | {r.get('loss', float('nan')):.4f} | "
                  f"{r['val_loss']:.4f} |" for r in evals]
        lines.append("")
    if "loss_curves" in files:
        lines += ["![loss, learning rate and gradient norm](loss_curves.png)", ""]
    lines += ["## Per-block residual-stream statistics", ""]
    if stats:
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
        if "layer_stats" in files:
            lines += ["![per-block statistics over training](layer_stats.png)", ""]
    else:
        lines += ["none logged (train.layer_stats_every = 0, or no step reached it yet)", ""]
    text = "\n".join(lines)
    tmp = run_dir / ".report.md.tmp"  # written whole, then renamed: never half a report
    tmp.write_text(text)
    tmp.replace(run_dir / "report.md")
    files["report"] = str(run_dir / "report.md")
    return RunReport(text, files, stats)
