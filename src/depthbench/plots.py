"""Sweep plots (PNG): loss vs aspect ratio, training curves, loss vs training FLOPs,
costs vs aspect ratio.

Matplotlib's object API on an Agg canvas (no pyplot, no global backend),
written through bytes so a sweep directory may be a bucket.  Every function
returns whether it wrote a figure."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

from etils import epath
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from depthbench.rundir.io import DamagedFile, read_jsonl
from depthbench.rundir.names import METRICS_FILE

DPI = 120  # sweep figures (analysis figures use their own)
REFERENCE_ALPHA = 0.65  # published curves are drawn lighter than measured ones


def _colors(names: Sequence[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def save_figure(fig: Figure, path, dpi: int = DPI):
    """Write ``fig`` as a PNG at ``path`` (a local path or a bucket's) and return
    ``path``: drawn on an Agg canvas and written as bytes, so no pyplot backend
    and no local file system are needed."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    epath.Path(path).write_bytes(buf.getvalue())
    return path


def _aspect_axis(ax, ars: Sequence[float], depths: Sequence[int] | None = None) -> None:
    ax.set_xscale("log")
    ticks = sorted(set(ars))
    ax.set_xlabel("aspect ratio d_model / L (log scale)")
    ax.grid(True, alpha=0.3)
    if len(ticks) > 9:  # several suites: plain log ticks, labels would collide
        from matplotlib.ticker import ScalarFormatter

        ax.xaxis.set_major_formatter(ScalarFormatter())
        return
    ax.set_xticks(ticks)
    if depths is not None:
        by_ar = dict(zip(ars, depths, strict=True))
        ax.set_xticklabels([f"{a:.3g}\nL{by_ar[a]}" for a in ticks])
    else:
        ax.set_xticklabels([f"{a:.3g}" for a in ticks])
    ax.minorticks_off()


def loss_vs_aspect(summary: dict, references: dict, path: str | epath.Path) -> bool:
    """One panel per suite: best-lr validation loss vs aspect ratio, one line
    per family, a star on each family's best shape; the published reference
    (``references[suite]``: reference.ReferencePoint list) dashed beside it."""
    suites = [s for s, rows in summary.items()
              if any(c.loss is not None for fr in rows for c in fr.cells) or references.get(s)]
    if not suites:
        return False
    families = list(dict.fromkeys(fr.family for s in suites for fr in summary[s]))
    families += [p.family for s in suites for p in references.get(s, [])
                 if p.family not in families]
    color = _colors(list(dict.fromkeys(families)))
    fig = Figure(figsize=(7.5 * len(suites), 5.2))
    for k, suite in enumerate(suites):
        ax = fig.add_subplot(1, len(suites), k + 1)
        ars, depths = [], []
        for fr in summary[suite]:
            ars += [c.aspect_ratio for c in fr.cells]
            depths += [c.depth for c in fr.cells]
            done = [c for c in fr.cells if c.loss is not None]
            if not done:
                continue
            ax.plot([c.aspect_ratio for c in done], [c.loss for c in done], "o-",
                    color=color[fr.family], label=fr.family, lw=1.6, ms=5)
            best = fr.best
            ax.plot([best.aspect_ratio], [best.loss], "*", color=color[fr.family], ms=16,
                    mec="black", mew=0.8, zorder=5)
        refs = references.get(suite, [])
        measured = {fr.family for fr in summary[suite]
                    if any(c.loss is not None for c in fr.cells)}
        for family in dict.fromkeys(p.family for p in refs):
            pts = sorted((p.aspect_ratio, p.val_loss) for p in refs if p.family == family)
            ax.plot([a for a, _ in pts], [v for _, v in pts], "x--", color=color[family],
                    alpha=REFERENCE_ALPHA, lw=1.0, ms=5,
                    label=None if family in measured else f"{family} (published only)")
            ars += [a for a, _ in pts]
            depths += [p.depth for p in sorted(refs, key=lambda p: p.aspect_ratio)
                       if p.family == family]
        unique = dict(zip(ars, depths, strict=True))
        _aspect_axis(ax, list(unique), list(unique.values()))
        ax.set_ylabel("final validation loss (nats/token)")
        ax.set_title(f"suite {suite}" if suite else "shape rule")
        handles, labels = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], marker="*", ls="", color="grey", mec="black", ms=12))
        labels.append("best shape")
        if refs:
            handles.append(Line2D([], [], marker="x", ls="--", color="grey"))
            labels.append("published (paper)")
        ax.legend(handles, labels, fontsize=8, ncol=2 if len(labels) > 8 else 1)
    save_figure(fig, path)
    return True


def load_curves(workdir: epath.Path, summary: dict) -> list[dict]:
    """Training and validation curves of the best run of every (family, shape)
    (a run whose metrics.jsonl is damaged has none: the report names it)."""
    curves = []
    for suite, family_rows in summary.items():
        for fr in family_rows:
            for cell in fr.cells:
                if cell.name is None:
                    continue
                try:
                    records = read_jsonl(epath.Path(workdir) / cell.name / METRICS_FILE)
                except DamagedFile:
                    continue
                train = [r for r in records if _num(r.get("loss")) and "step" in r]
                val = [r for r in records if _num(r.get("val_loss")) and "step" in r]
                if not train and not val:
                    continue
                curves.append({
                    "suite": suite, "family": fr.family, "depth": cell.depth,
                    "aspect_ratio": cell.aspect_ratio, "name": cell.name,
                    "step": [r["step"] for r in train], "loss": [r["loss"] for r in train],
                    "val_step": [r["step"] for r in val], "val_loss": [r["val_loss"] for r in val],
                })
    return curves


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _family_panels(curves: Sequence[dict]):
    """(figure, [(panel axes, its curves widest first, their colours)]): one titled
    panel per (suite, family) of ``curves``, coloured by aspect ratio (log scale)."""
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    panels = list(dict.fromkeys((c["suite"], c["family"]) for c in curves))
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.3 * nrows), layout="constrained")
    ars = [c["aspect_ratio"] for c in curves]
    norm = LogNorm(vmin=min(ars), vmax=max(ars) * (1.0001 if min(ars) == max(ars) else 1.0))
    cmap = colormaps["viridis"]
    one_suite = len({suite for suite, _ in panels}) == 1
    out = []
    for k, (suite, family) in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        ax.set_title(family if one_suite else f"{family} ({suite})", fontsize=10)
        ax.grid(True, alpha=0.3)
        mine = sorted((c for c in curves if (c["suite"], c["family"]) == (suite, family)),
                      key=lambda c: -c["aspect_ratio"])
        # viridis' top end is too pale
        out.append((ax, mine, [cmap(0.85 * norm(c["aspect_ratio"])) for c in mine]))
    return fig, out


def _shared_ylim(axes, losses: Sequence[float]) -> None:
    if losses:
        lo, hi = min(losses), max(losses)
        pad = 0.05 * max(hi - lo, 1e-3)
        for ax in axes:
            ax.set_ylim(lo - pad, hi + pad)


def training_curves(curves: Sequence[dict], path: str | epath.Path) -> bool:
    """One panel per family: loss vs step per aspect ratio (colour), val dots."""
    if not curves:
        return False
    fig, panels = _family_panels(curves)
    for ax, mine, colours in panels:
        for c, col in zip(mine, colours, strict=True):
            ax.plot(c["step"], c["loss"], color=col, lw=1.0,
                    label=f"AR {c['aspect_ratio']:.3g} (L{c['depth']})")
            if c["val_step"]:
                ax.plot(c["val_step"], c["val_loss"], "o", color=col, ms=4, mec="black",
                        mew=0.5)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend(fontsize=7)
    losses = [v for c in curves for v in c["loss"][len(c["loss"]) // 10:]]
    _shared_ylim([p[0] for p in panels], losses + [v for c in curves for v in c["val_loss"]])
    save_figure(fig, path)
    return True


def loss_vs_flops(curves: Sequence[dict], budgets: dict, path: str | epath.Path,
                  ylabel: str) -> bool:
    """One panel per family: loss vs training FLOPs (log scale) per aspect ratio
    (colour), the logged loss thin and its monotone fit thick; a dotted line at
    the family's equal-FLOPs budget and a star where the winning shape meets it.

    ``curves``: dicts with suite, family, depth, aspect_ratio, flops, raw, fit;
    ``budgets``: {(suite, family): (budget FLOPs, winning depth, its loss)}."""
    curves = [c for c in curves if len(c["flops"])]
    if not curves:
        return False
    fig, panels = _family_panels(curves)
    for ax, mine, colours in panels:
        for c, col in zip(mine, colours, strict=True):
            ax.plot(c["flops"], c["raw"], color=col, lw=0.7, alpha=0.45)
            ax.plot(c["flops"], c["fit"], color=col, lw=1.8, marker="o" if len(c["fit"]) < 8
                    else None, ms=4, label=f"AR {c['aspect_ratio']:.3g} (L{c['depth']})")
        budget, depth, loss = budgets.get((mine[0]["suite"], mine[0]["family"]),
                                          (None, None, None))
        if budget is not None:
            ax.axvline(budget, color="grey", ls=":", lw=1.2)
        won = [col for c, col in zip(mine, colours, strict=True) if c["depth"] == depth]
        if loss is not None and won:
            ax.plot([budget], [loss], "*", color=won[0], ms=15, mec="black", mew=0.8, zorder=5)
        ax.set_xscale("log")
        ax.set_xlabel("training FLOPs (log scale)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    tail = [v for c in curves for v in c["fit"][len(c["fit"]) // 10:]]
    tail += [v for c in curves for v in c["raw"][len(c["raw"]) // 10:]]
    _shared_ylim([p[0] for p in panels], tail)
    save_figure(fig, path)
    return True


def costs_vs_aspect(cost_rows: Sequence[dict], path: str | epath.Path) -> bool:
    """Prefill FLOPs, KV cache and residual-state bytes per token vs aspect
    ratio, one line per family, one row of panels per suite."""
    if not cost_rows:
        return False
    suites = list(dict.fromkeys(r["suite"] for r in cost_rows))
    families = list(dict.fromkeys(r["family"] for r in cost_rows))
    color = _colors(families)
    markers = "os^vDP<>Xhp*d"
    panels = (("prefill_flops", 1e9, "prefill GFLOPs per sequence"),
              ("kv_cache_bytes", 2**20, "KV cache MiB per sequence (bf16)"),
              ("state_bytes_per_token", 1.0, "residual state bytes per token (bf16)"))
    fig = Figure(figsize=(16, 4.4 * len(suites)), layout="constrained")
    for row, suite in enumerate(suites):
        rows = [r for r in cost_rows if r["suite"] == suite]
        seqs = ", ".join(str(t) for t in sorted({r["seq_len"] for r in rows}))
        for k, (field, scale, label) in enumerate(panels):
            ax = fig.add_subplot(len(suites), 3, 3 * row + k + 1)
            for i, family in enumerate(families):
                pts = sorted((r["aspect_ratio"], r[field] / scale) for r in rows
                             if r["family"] == family)
                if pts:
                    # Families with equal costs overlap; the marker tells them apart.
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="-",
                            marker=markers[i % len(markers)], color=color[family], ms=5,
                            lw=1.2, alpha=0.85, label=family)
            ars = {r["aspect_ratio"]: r["depth"] for r in rows}
            _aspect_axis(ax, list(ars), list(ars.values()))
            ax.set_ylabel(label)
            ax.set_title(f"{suite or 'shape rule'}, T = {seqs}", fontsize=9)
            if k == 0:
                ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path)
    return True


__all__ = ["costs_vs_aspect", "load_curves", "loss_vs_aspect", "loss_vs_flops",
           "training_curves"]
