"""Downstream evaluation of runs: the completion-only NLL suite, the lm-eval
backend and the suites (docs/EVAL.md).  ``lm_backend`` imports lm-eval."""
