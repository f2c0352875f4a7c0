"""report.md's text: the tables of each suite, the plots, costs, the sections
other modules add (equal compute, analyses, downstream evaluation), every
run, and the damaged runs."""

from __future__ import annotations

from collections.abc import Sequence

from depthbench import reference, variants
from depthbench import sweep as sweeplib
from depthbench.report.rows import shown_status
from depthbench.report.summary import FamilyRow
from depthbench.report.tables import (
    costs_table,
    loss_table,
    lr_table,
    md_table,
    reference_table,
    runs_table,
)


def markdown(workdir: str, rows: Sequence[dict], summary: dict[str, list[FamilyRow]],
             costs_rows: Sequence[dict], plots: dict[str, str | None],
             sections: Sequence[str] = (), equal_compute: Sequence[str] = ()) -> str:
    counts = {s: sum(shown_status(r) == s for r in rows) for s in sweeplib.STATUSES}
    status = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    out = [f"# depthbench sweep report: `{workdir}`", "",
           f"{len(rows)} runs: {status}.  Metric: validation loss at the end of training "
           "(nats per token); each cell is the best learning rate's run, **bold** the family's "
           "best aspect ratio (d_model / L).", ""]
    labelled = sorted({r["family"] for r in rows if variants.SEPARATOR in str(r["family"])})
    if labelled:
        out += ["Rows named `family+variant` (" + ", ".join(f"`{f}`" for f in labelled) + ") "
                "train the plain family with the variant's config overrides "
                "(`depthbench.variants`): the difference from the family's own row is the "
                "variant's effect at the same recipe, shapes and seed.", ""]
    for suite, family_rows in summary.items():
        title = f"suite `{suite}`" if suite else "shape rule"
        out += [f"## Validation loss by aspect ratio, {title}", ""]
        out += [md_table(*loss_table(family_rows), align="l"), ""]
        out += [f"### Best learning rate per shape, {title}", ""]
        out += [md_table(*lr_table(family_rows), align="l"), ""]
        ref = reference_table(suite, family_rows)
        if ref is not None:
            out += [f"### Measured / published validation loss, {title}", "",
                    f"Published: {reference.SOURCE}.", ""]
            out += [md_table(*ref, align="l"), ""]
        elif suite.startswith("paper-"):
            out += [f"No published reference losses for `{suite}` "
                    "(only paper-400m has them).", ""]
    out += ["## Plots", ""]
    captions = {
        "loss_vs_aspect": "Validation loss vs aspect ratio (best learning rate per shape; "
                          "star: best shape; dashed: published reference)",
        "training_curves": "Training loss (lines) and validation loss (dots) of each shape's "
                           "best run",
        "costs_vs_aspect": "Prefill FLOPs, KV cache and residual-state memory vs aspect ratio",
    }
    for key, caption in captions.items():
        if plots.get(key):
            out += [f"![{caption}]({plots[key]})", "", f"*{caption}.*", ""]
        else:
            out += [f"*{caption}: not drawn ({plots.get(key + '_why', 'no data')}).*", ""]
    if costs_rows:
        out += ["## Costs per shape (no training needed)", "",
                "Prefill FLOPs per sequence of T tokens (matrix products of the backbone, "
                "causal attention halved; LM head excluded), bf16 KV cache per sequence, "
                "residual-state activation bytes per token (depthbench.costs).", ""]
        out += [md_table(*costs_table(costs_rows), align="l"), ""]
    out += list(equal_compute)  # the "Loss at equal compute" section's lines
    from depthbench.analysis import report_section  # runs analysed by `depthbench analyze`

    out += report_section.markdown_lines(workdir, rows, md_table)
    out += list(sections)  # e.g. the downstream evaluation section
    out += ["## All runs", "", md_table(*runs_table(rows), align="ll"), ""]
    damaged = [r for r in rows if r.get("damage")]
    if damaged:
        out += ["## Damaged runs", "",
                "Their records cannot be read, so none of their values is shown above "
                "(results.csv keeps what it held).", ""]
        out += [f"- `{r['name']}`: {r['damage']}" for r in damaged] + [""]
    return "\n".join(out)
