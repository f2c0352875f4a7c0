"""The report's per-family analysis section: headline depth numbers of every
run of a sweep that has ``analysis/analysis.json`` (``depthbench analyze``,
or the sweep's ``analyze`` switch)."""

from __future__ import annotations

from collections.abc import Sequence

from etils import epath

from depthbench.rundir.io import DamagedFile, read_json
from depthbench.rundir.names import ANALYSIS_DIR, ANALYSIS_FILE

HEADERS = ("family", "L", "aspect ratio", "late skip", "late swap", "effective depth",
           "mean D(l, l+1)", "lens KL at L/2", "dead segment", "stream mixing rank")


def _read(path: epath.Path) -> dict | None:
    try:
        return read_json(path)
    except DamagedFile:
        return None  # a damaged analysis is not shown


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def analysed_rows(workdir, rows: Sequence[dict]) -> list[list[str]]:
    """One table row per analysed run, sorted by family then depth."""
    out = []
    for row in rows:
        result = _read(epath.Path(workdir) / row["name"] / ANALYSIS_DIR / ANALYSIS_FILE)
        if result is None:
            continue
        meta = result.get("meta", {})
        L = int(meta.get("depth", row.get("depth") or 0))
        lli = result.get("late_layer_interaction", {})
        ed = result.get("effective_depth")
        adj = [v for v in result.get("angular_distance", {}).get("adjacent", []) if v is not None]
        kl = result.get("logit_lens", {}).get("kl_to_final", [])
        dw = result.get("depth_weights", {})
        sd = result.get("stream_diversity", {})
        rank = sd.get("composed_effective_rank_final")
        # The sweep's label (``hc+sum_then_norm``), not the trained family's plain name.
        out.append([str(row.get("family") or meta.get("family")), str(L),
                    f"{float(row['aspect_ratio']):.1f}" if row.get("aspect_ratio") else "",
                    _pct(lli.get("skip_fraction")), _pct(lli.get("swap_fraction")),
                    f"{ed['value']} / {L}" if ed else "",
                    f"{sum(adj) / len(adj):.3f}" if adj else "",
                    f"{kl[len(kl) // 2]:.3f}" if kl else "",
                    str(dw["dead_segment"]) if "dead_segment" in dw else "",
                    f"{rank:.2f}" if rank is not None else ""])
    return sorted(out, key=lambda r: (r[0], int(r[1])))


def markdown_lines(workdir, rows: Sequence[dict], md_table) -> list[str]:
    """The section's markdown lines (none when no run was analysed)."""
    body = analysed_rows(workdir, rows)
    if not body:
        return []
    return ["## Depth analyses", "",
            "Per analysed run (docs/spec/analysis.md): late-layer interaction (fraction of "
            "pairs with both blocks >= L/4 whose skip causal score > 0.45 / swap score > 0.15), "
            "effective depth (blocks whose removal alone raises loss by > 1%), mean angular "
            "distance between neighbouring depth states, the logit lens's KL to the final "
            "output half-way up, the depth-attention families' dead segment and the stream "
            "families' composed stream-mixing rank.  Plots: `RUN/analysis/*.png`.", "",
            md_table(HEADERS, body, align="l"), ""]
