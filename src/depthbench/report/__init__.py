"""Turn a sweep directory into tables: per family, loss at each aspect ratio.

For every (suite, family, depth) the best learning rate is the finished,
non-diverged run with the lowest final validation loss; a family's best
aspect ratio is the shape whose best run has the lowest loss.  Sweeps of the
paper-400m suite are set beside the published losses (depthbench.reference).

The tables come from ``results.csv`` (kept by ``depthbench sweep``), with
rows refreshed from run directories that finished after it was written;
``write_report`` renders them as report.md, rewrites results.csv, and draws
the plots of :mod:`depthbench.plots`.

A run whose records are damaged (:mod:`depthbench.rundir.damage`: a
``result.json``, ``config.json``, ``sweep_run.json`` or JSON-lines log that
cannot be read) is never shown from results.csv as if it were whole: its row
is marked damaged (no loss in the tables, the file named in the runs table,
a "Damaged runs" section) and named in one warning (:attr:`Report.warnings`).

One module per job:

* :mod:`~depthbench.report.rows`: results.csv's rows, read and refreshed
  from the run directories;
* :mod:`~depthbench.report.summary`: the best run per (suite, family, depth);
* :mod:`~depthbench.report.tables`: the markdown tables (loss, learning
  rate, published reference, runs, costs);
* :mod:`~depthbench.report.shape_costs`: the cost model applied to the sweep's
  shapes;
* :mod:`~depthbench.report.figures`: the sweep's PNG plots;
* :mod:`~depthbench.report.finetuned`: the fine-tuned runs' held-out
  instruction loss, before and after;
* :mod:`~depthbench.report.document`: report.md's text;
* :mod:`~depthbench.report.write`: all of it written into the sweep
  directory (report.md, results.csv, plots) and its JSON summary.
"""

from depthbench.report.document import markdown
from depthbench.report.rows import load_rows, parse_csv
from depthbench.report.shape_costs import cost_rows, train_flops_per_token
from depthbench.report.summary import Cell, FamilyRow, summarize
from depthbench.report.tables import loss_table, lr_table, md_table, reference_table
from depthbench.report.write import CSV_COLUMNS, Report, summary_json, write_report

__all__ = ["CSV_COLUMNS", "Cell", "FamilyRow", "Report", "cost_rows", "load_rows", "loss_table",
           "lr_table", "markdown", "md_table", "parse_csv", "reference_table", "summarize",
           "summary_json", "train_flops_per_token", "write_report"]
