"""The names of what a run directory and a sweep directory hold.

Every module that reads or writes one of these files takes its name from
here, so a reader and a writer can never disagree about where a record is.

A run directory (``depthbench train --workdir``, one directory of a sweep,
or ``depthbench import-hf --out``)::

    config.json          the config the run started with, plus "resolved"
    result.json          written atomically when the run ends
    metrics.jsonl        one JSON object per logged step
    layer_stats.jsonl    per-block statistics, one JSON object per logged step
    tb/                  TensorBoard events (the same scalars and statistics)
    checkpoints/<step>/  Orbax checkpoints, each sealed by integrity.json
    checkpoints.damaged/ steps the trainer found damaged and moved aside
    run.lock             the process training it
    tokenizer.json       an imported run's tokenizer
    report.md, loss_curves.png, layer_stats.png    depthbench report
    analysis/analysis.json                         depthbench analyze
    eval/<suite>.json                              depthbench eval
    sweep_run.json, failure.txt                    when a sweep trains it
    sft/                 the run fine-tuned (a run directory) when a sweep's
                         spec sets finetune.records

A sweep directory holds one run directory per run, ``sweep.json`` (the
expanded sweep), ``results.csv`` and the sweep report.
"""

from __future__ import annotations

# ------------------------------------------------------------ a run directory
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

# ---------------------------------------------------------- a sweep directory
MANIFEST = "sweep.json"
RESULTS_CSV = "results.csv"

# The JSON records a reader trusts, in the order a report checks them.
RECORDS = (CONFIG_FILE, RESULT_FILE, METRICS_FILE, LAYER_STATS_FILE, RUN_RECORD)
# What a run directory's own commands write there: no other command's output
# may land on one of these or inside one (output_paths.resolve).
RUN_OWN = (*RECORDS, *TOKENIZER_FILES, TB_DIR, CHECKPOINT_DIR, CHECKPOINT_DIR + DAMAGED_SUFFIX,
           METRICS_FILE + DAMAGED_SUFFIX, LOCK_FILE, REPORT_FILE, LOSS_CURVES_PLOT,
           LAYER_STATS_PLOT, ANALYSIS_DIR, EVAL_DIR, FAILURE_FILE)
