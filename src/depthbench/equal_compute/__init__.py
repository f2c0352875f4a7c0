"""Loss at equal compute (issue 31): what each run of a sweep cost in training
FLOPs, its speedup over pre_ln at the same shape, and the aspect ratio that
wins at equal FLOPs rather than at equal tokens.

:mod:`.curves` holds the arithmetic on loss curves (pure functions);
:mod:`.section` reads a sweep's runs and writes the report's section and
the columns it adds to results.csv.
"""

from depthbench.equal_compute.curves import (
    Curve,
    Speedup,
    equal_budget,
    loss_at,
    monotone_fit,
    speedup,
    tokens_to_reach,
)
from depthbench.equal_compute.section import COLUMNS, EqualCompute, analyse

__all__ = ["COLUMNS", "Curve", "EqualCompute", "Speedup", "analyse", "equal_budget", "loss_at",
           "monotone_fit", "speedup", "tokens_to_reach"]
