"""The report's fine-tuning section: each shape's best run's held-out instruction
loss before and after its fine-tuning (``RUN_DIR/sft/result.json``, written
when a sweep's spec sets ``finetune.records``: docs/FINETUNE.md), per family
and aspect ratio.  Empty with no fine-tuned run."""

from __future__ import annotations

from etils import epath

from depthbench.report.summary import FamilyRow
from depthbench.rundir.io import DamagedFile, finite, read_json
from depthbench.rundir.names import FINETUNE_DIR, RESULT_FILE


def _losses(workdir: epath.Path, name: str) -> tuple[float, float] | None:
    """(before, after) of run ``name``'s fine-tuning, if it finished."""
    try:
        result = read_json(epath.Path(workdir) / name / FINETUNE_DIR / RESULT_FILE)
    except DamagedFile:
        return None
    if not result or result.get("status") != "finished":
        return None
    before = (result.get("finetune") or {}).get("initial_val_loss")
    after = result.get("final_val_loss")
    return (before, after) if finite(before) and finite(after) else None


def table(workdir: epath.Path, family_rows: list[FamilyRow]
          ) -> tuple[list[str], list[list[str]]] | None:
    """Headers and rows (``before -> after`` per shape), or None when no run has one."""
    rows, any_found = [], False
    for fr in family_rows:
        cells = []
        for cell in fr.cells:
            found = _losses(workdir, cell.name) if cell.name else None
            any_found |= found is not None
            cells.append("-" if found is None else f"{found[0]:.4f} → {found[1]:.4f}")
        rows.append([fr.family, *cells])
    if not any_found:
        return None
    headers = ["family"] + [f"AR {c.aspect_ratio:.1f} (L{c.depth})"
                            for c in family_rows[0].cells]
    return headers, rows


def section(workdir: epath.Path, summary: dict[str, list[FamilyRow]], md_table) -> list[str]:
    """Markdown lines of the section (none without a fine-tuned run)."""
    out = []
    for suite, family_rows in summary.items():
        found = table(workdir, family_rows)
        if found is None:
            continue
        title = f"suite `{suite}`" if suite else "shape rule"
        out += [f"### Held-out instruction loss, {title}", "", md_table(*found, align="l"), ""]
    if not out:
        return []
    return ["## Fine-tuning", "",
            "Each shape's best run fine-tuned on instruction records (`RUN_DIR/sft/`, "
            "docs/FINETUNE.md): the held-out loss over response tokens (nats per token) of "
            "the pretrained model, then of the fine-tuned one.", "", *out]
