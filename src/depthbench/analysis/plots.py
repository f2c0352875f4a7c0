"""PNG plots of an ``analysis.json`` (one run) and of several side by side, drawn
as ``depthbench.plots`` draws (object API, Agg canvas); each function
returns the paths it wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from depthbench.plots import save_figure

DPI = 110  # a touch smaller than the sweep figures' (depthbench.plots.DPI)


def _matrix(rows) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in r] for r in rows], np.float64)


def _heatmap(ax, m: np.ndarray, title: str, xlabel: str, ylabel: str, cmap: str, fig) -> None:
    masked = np.ma.masked_invalid(m)
    im = ax.imshow(masked, cmap=cmap, origin="upper", interpolation="nearest")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.colorbar(im, ax=ax, shrink=0.8)


def _title(result: dict) -> str:
    meta = result.get("meta", {})
    return f"{meta.get('family', '?')} L{meta.get('depth', '?')}"


def plot_run(result: dict, out_dir: str | Path) -> list[Path]:
    """All plots that apply to one run's analysis into ``out_dir``."""
    out, written = Path(out_dir), []
    title = _title(result)
    if "angular_distance" in result:
        fig = Figure(figsize=(5.2, 4.4))
        _heatmap(fig.add_subplot(), _matrix(result["angular_distance"]["matrix"]),
                 f"angular distance D(i, j), {title}", "depth j", "depth i", "viridis_r", fig)
        written.append(save_figure(fig, out / "angular_distance.png", dpi=DPI))
    mats = [(k, lab, cm) for k, lab, cm in
            (("causal_score", "causal score C(s, l)", "Blues"),
             ("permutation_score", "swap score P(i, j)", "Oranges")) if k in result]
    if mats:
        fig = Figure(figsize=(5.2 * len(mats), 4.4))
        for i, (key, label, cmap) in enumerate(mats):
            ylabel = "skipped block s" if key == "causal_score" else "block i"
            xlabel = "affected block l" if key == "causal_score" else "block j"
            _heatmap(fig.add_subplot(1, len(mats), i + 1), _matrix(result[key]["matrix"]),
                     f"{label}, {title}", xlabel, ylabel, cmap, fig)
        written.append(save_figure(fig, out / "causal_and_swap.png", dpi=DPI))
    if "logit_lens" in result:
        lens = result["logit_lens"]
        fig = Figure(figsize=(13, 3.6))
        for i, (key, label) in enumerate((("early_exit_ce", "early-exit CE"),
                                          ("kl_to_final", "KL(p_final || p_l)"),
                                          ("top5_overlap", "top-5 overlap with final"))):
            ax = fig.add_subplot(1, 3, i + 1)
            ax.plot(range(len(lens[key])), lens[key], marker="o", markersize=3)
            if key == "early_exit_ce":
                ax.axhline(lens["final_loss"], color="black", linestyle="--", linewidth=1)
            ax.set_xlabel("depth state l")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        fig.suptitle(f"logit lens, {title}")
        written.append(save_figure(fig, out / "logit_lens.png", dpi=DPI))
    if "depth_weights" in result:
        dw = result["depth_weights"]
        fig = Figure(figsize=(6, 4.6))
        w = np.array(dw["weights"], np.float64)
        w[w == 0] = np.nan  # sources not yet written
        _heatmap(fig.add_subplot(), w, f"depth weights, {title} (dead segment "
                 f"{dw['dead_segment']})", "source (0 = embedding)", "sublayer j", "magma_r", fig)
        written.append(save_figure(fig, out / "depth_weights.png", dpi=DPI))
    if "stream_diversity" in result and "mixing" in result["stream_diversity"]:
        sd = result["stream_diversity"]
        mix = np.array(sd["mixing"])
        cols = min(8, len(mix))
        picks = np.unique(np.linspace(0, len(mix) - 1, cols).astype(int))
        fig = Figure(figsize=(2.2 * len(picks), 4.6))
        for i, j in enumerate(picks):
            ax = fig.add_subplot(2, len(picks), i + 1)
            ax.imshow(mix[j], cmap="RdBu_r", vmin=-1.5, vmax=1.5)
            ax.set_title(f"M_{j}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        ax = fig.add_subplot(2, 1, 2)
        ax.plot(sd["composed_effective_rank"], marker="o", markersize=3, label="composed mixing")
        ax.set_xlabel("sublayer j")
        ax.set_ylabel("effective rank")
        ax.grid(alpha=0.3)
        fig.suptitle(f"residual mixing matrices, {title}")
        written.append(save_figure(fig, out / "stream_mixing.png", dpi=DPI))
    return written


# Per-depth series that --compare can draw: (key path, label).
SERIES = {
    "angular_distance": (("angular_distance", "adjacent"), "D(l, l+1)"),
    "logit_lens": (("logit_lens", "kl_to_final"), "KL(p_final || p_l)"),
    "early_exit_ce": (("logit_lens", "early_exit_ce"), "early-exit CE"),
    "token_collapse": (("token_collapse", "effective_rank"), "token effective rank"),
    "block_jacobian": (("block_jacobian", "deviation"), "||J - I||_F / sqrt(d)"),
    "layer_pruning": (("layer_pruning", "delta"), "loss increase when pruned"),
    "usefulness": (("usefulness", "loss_ratio"), "loss ratio, affine stand-in"),
    "causal_score": (("causal_score", "per_block"), "mean future causal score"),
}


def compare(results: list[dict], metric: str, path: str | Path) -> Path:
    """One metric of several runs side by side: a per-depth curve per run
    (depth normalised to [0, 1] so different depths share an axis), or a
    row of heatmaps for the matrix metrics."""
    path = Path(path)
    names = [_title(r) for r in results]
    if metric == "permutation_score":
        fig = Figure(figsize=(4.6 * len(results), 4.2))
        for i, r in enumerate(results):
            _heatmap(fig.add_subplot(1, len(results), i + 1), _matrix(r[metric]["matrix"]),
                     names[i], "j", "i", "Oranges", fig)
        return save_figure(fig, path, dpi=DPI)
    if metric == "angular_distance_matrix":
        fig = Figure(figsize=(4.6 * len(results), 4.2))
        for i, r in enumerate(results):
            _heatmap(fig.add_subplot(1, len(results), i + 1),
                     _matrix(r["angular_distance"]["matrix"]), names[i], "j", "i", "viridis_r",
                     fig)
        return save_figure(fig, path, dpi=DPI)
    (section, key), label = SERIES[metric]
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for name, r in zip(names, results, strict=True):
        y = np.array([np.nan if v is None else v for v in r[section][key]], np.float64)
        x = np.arange(len(y)) / max(len(y) - 1, 1)
        ax.plot(x, y, marker="o", markersize=3, label=name)
    ax.set_xlabel("relative depth")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=DPI)


COMPARABLE = (*SERIES, "permutation_score", "angular_distance_matrix")
