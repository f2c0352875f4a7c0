"""The report's markdown tables: loss and learning rate per shape, measured
against published, every run, costs per shape."""

from __future__ import annotations

from collections.abc import Sequence

from depthbench import reference, shapes
from depthbench.formatting import fmt_count, fmt_lr
from depthbench.report.summary import Cell, FamilyRow
from depthbench.rundir.io import finite


def md_table(headers: Sequence[str], body: Sequence[Sequence[str]], align: str = "") -> str:
    """A markdown table; ``align`` has one letter per column, ``l`` or ``r``
    (columns past its end: ``r``)."""
    align = align.ljust(len(headers), "r")
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _shape_header(cell: Cell) -> str:
    return f"AR {cell.aspect_ratio:.1f} (L{cell.depth})"


def _cell_text(cell: Cell, best: Cell | None, what: str, bold: bool = True) -> str:
    if cell.loss is None:
        return {"diverged": "diverged", "failed": "failed", "damaged": "damaged"}.get(
            cell.state, "-")
    text = f"{cell.loss:.4f}" if what == "loss" else fmt_lr(cell.lr)
    return f"**{text}**" if bold and best is not None and cell.depth == best.depth else text


def loss_table(family_rows: Sequence[FamilyRow]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: loss at each aspect ratio, best AR and loss per family."""
    headers = ["family"] + [_shape_header(c) for c in family_rows[0].cells] + [
        "best AR", "best loss", "best lr"]
    body = []
    for fr in family_rows:
        best = fr.best
        body.append([fr.family] + [_cell_text(c, best, "loss") for c in fr.cells] + (
            [f"{best.aspect_ratio:.1f}", f"{best.loss:.4f}", fmt_lr(best.lr)]
            if best else ["-", "-", "-"]))
    return headers, body


def lr_table(family_rows: Sequence[FamilyRow]) -> tuple[list[str], list[list[str]]]:
    headers = ["family"] + [_shape_header(c) for c in family_rows[0].cells]
    body = [[fr.family] + [_cell_text(c, None, "lr", bold=False) for c in fr.cells]
            for fr in family_rows]
    return headers, body


def reference_table(suite: str, family_rows: Sequence[FamilyRow]
                    ) -> tuple[list[str], list[list[str]]] | None:
    """Measured vs published loss per shape ("measured / published (delta)")."""
    ref = reference.losses(suite)
    if not ref:
        return None
    depths = sorted({d for by_depth in ref.values() for d in by_depth})
    s = shapes.suite(suite)
    headers = ["family"] + [f"AR {s.shape(d).aspect_ratio:.1f} (L{d})" for d in depths] + [
        "best AR measured", "best AR published"]
    measured = {fr.family: fr for fr in family_rows}
    body = []
    for family, by_depth in ref.items():
        fr = measured.get(family)
        cells = {c.depth: c for c in fr.cells} if fr else {}
        row = [family]
        for d in depths:
            if d not in by_depth:
                row.append("-")
                continue
            c = cells.get(d)
            if c is not None and c.loss is not None:
                row.append(f"{c.loss:.3f} / {by_depth[d]:.3f} ({c.loss - by_depth[d]:+.3f})")
            else:
                row.append(f"- / {by_depth[d]:.3f}")
        best = fr.best if fr else None
        row.append(f"{best.aspect_ratio:.1f}" if best else "-")
        row.append(f"{s.shape(reference.best_depth(suite, family)).aspect_ratio:.1f}")
        body.append(row)
    return headers, body


def _fmt_count(n: float | None) -> str:
    return "-" if n is None else fmt_count(n)


def runs_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    headers = ["run", "family", "L", "AR", "lr", "params", "val loss", "tokens/s", "MFU",
               "status"]
    body = []
    for r in rows:
        if r.get("damage"):  # nothing of a damaged run is shown as measured
            body.append([r["name"], r["family"], str(r["depth"]), f"{r['aspect_ratio']:.1f}",
                         fmt_lr(r["lr"]), "-", "-", "-", "-", "damaged (see below)"])
            continue
        body.append([
            r["name"], r["family"], str(r["depth"]), f"{r['aspect_ratio']:.1f}",
            fmt_lr(r["lr"]), _fmt_count(r.get("params")),
            f"{r['final_val_loss']:.4f}" if finite(r.get("final_val_loss")) else "-",
            f"{r['tokens_per_sec']:,.0f}" if finite(r.get("tokens_per_sec")) else "-",
            f"{100 * r['mfu']:.1f}%" if finite(r.get("mfu")) else "-",
            r["status"] + (f" @{r['diverged_at_step']}" if r.get("diverged_at_step") else ""),
        ])
    return headers, body


def costs_table(cost_rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    headers = ["family", "L", "d_model", "AR", "params", "prefill GFLOPs", "KV cache MiB",
               "state B/token", "T"]
    body = [[c["family"], str(c["depth"]), str(c["d_model"]), f"{c['aspect_ratio']:.1f}",
             _fmt_count(c["params"]), f"{c['prefill_flops'] / 1e9:,.2f}",
             f"{c['kv_cache_bytes'] / 2**20:,.2f}", f"{c['state_bytes_per_token']:,}",
             str(c["seq_len"])] for c in cost_rows]
    return headers, body
