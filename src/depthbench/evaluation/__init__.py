"""Downstream evaluation of runs: completion-only NLL suite, lm-eval backend, suites.

``scoring`` (bucketed, jitted scoring and greedy generation on a loaded run),
``nll_suite`` (the original benchmark's code/STEM/math NLL formats),
``records`` (local jsonl/parquet or hub data), ``runner`` (one run, one
suite, ``RUN_DIR/eval/<suite>.json``) and ``lm_backend`` (the ``depthbench``
model of lm-evaluation-harness; imports lm-eval).
"""
