"""Turn a sweep directory into tables: per family, loss at each aspect ratio.

Every (suite, family, depth) is shown by its best learning rate's run, beside
the published losses for paper-400m; a run with damaged records is marked and
named in one warning, never shown as if whole.  One submodule per job."""

from depthbench.report.document import markdown
from depthbench.report.rows import load_rows, parse_csv
from depthbench.report.shape_costs import cost_rows, train_flops_per_token
from depthbench.report.summary import Cell, FamilyRow, summarize
from depthbench.report.tables import loss_table, lr_table, md_table, reference_table
from depthbench.report.write import CSV_COLUMNS, Report, summary_json, write_report

__all__ = ["CSV_COLUMNS", "Cell", "FamilyRow", "Report", "cost_rows", "load_rows", "loss_table",
           "lr_table", "markdown", "md_table", "parse_csv", "reference_table", "summarize",
           "summary_json", "train_flops_per_token", "write_report"]
