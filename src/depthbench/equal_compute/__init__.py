"""Loss at equal compute (issue 31; docs/EQUAL_COMPUTE.md): each run's training
FLOPs, its speedup over pre_ln at the same shape, and the aspect ratio that
wins at equal FLOPs.  :mod:`.curves` is the arithmetic, :mod:`.section` the
report's section and results.csv columns."""

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
