"""The names of what a run directory and a sweep directory hold (docs/RUNS.md
has the layout).  Every reader and writer takes its names from here, so they
can never disagree about where a record is."""

from __future__ import annotations

CONFIG_FILE = "config.json"
RESULT_FILE = "result.json"
METRICS_FILE = "metrics.jsonl"
LAYER_STATS_FILE = "layer_stats.jsonl"
TB_DIR = "tb"
CHECKPOINT_DIR = "checkpoints"
INTEGRITY_FILE = "integrity.json"  # inside each checkpoint step
DAMAGED_SUFFIX = ".damaged"  # checkpoints.damaged/, metrics.jsonl.damaged
LOCK_FILE = "run.lock"
TOKENIZER_FILE = "tokenizer.json"
# Tokenizer files a run directory may carry (an imported run's: a Hugging Face
# tokenizer directory's), copied along by the imports and the exports.
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "generation_config.json")
REPORT_FILE = "report.md"
LOSS_CURVES_PLOT = "loss_curves.png"
LAYER_STATS_PLOT = "layer_stats.png"
ANALYSIS_DIR = "analysis"
ANALYSIS_FILE = "analysis.json"
EVAL_DIR = "eval"
RUN_RECORD = "sweep_run.json"  # the sweep's record of the run (its config)
FAILURE_FILE = "failure.txt"  # the traceback of a run whose trainer raised
FINETUNE_DIR = "sft"  # a sweep's fine-tuning of the run, itself a run directory

# A sweep directory holds these beside its run directories.
MANIFEST = "sweep.json"
RESULTS_CSV = "results.csv"

# The JSON records a reader trusts, in the order a report checks them.
RECORDS = (CONFIG_FILE, RESULT_FILE, METRICS_FILE, LAYER_STATS_FILE, RUN_RECORD)
# What a run directory's own commands write there: no other command's output
# may land on one of these or inside one (output_paths.resolve).
RUN_OWN = (*RECORDS, *TOKENIZER_FILES, TB_DIR, CHECKPOINT_DIR, CHECKPOINT_DIR + DAMAGED_SUFFIX,
           METRICS_FILE + DAMAGED_SUFFIX, LOCK_FILE, REPORT_FILE, LOSS_CURVES_PLOT,
           LAYER_STATS_PLOT, ANALYSIS_DIR, EVAL_DIR, FAILURE_FILE)
