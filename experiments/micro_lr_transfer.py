"""Does the best learning rate at the shallowest depth stay the best at the deepest?

    depthbench sweep --config experiments/micro_lr_transfer.py --workdir runs/lr_transfer
    depthbench report runs/lr_transfer

The quickstart's recipe (150 steps of 8 x 128 tokens on the micro corpus) at
the micro suite's shallowest and deepest shapes (L2, aspect ratio 76; L10,
aspect ratio 8), each at four learning rates a factor of ~3 apart, for
pre_ln, two families that use depth (hc with the sum_then_norm readout,
attnres_full) and CompleteP (alpha 1) and depth-muP (alpha 0.5) with and
without their own learning-rate rule (``+lr_rule``: block learning rate x
(L / L_base)^(alpha - 1), Adam epsilon x (L / L_base)^-alpha).  56 runs.

The report's "Learning rate across depth" section (depthbench.lr_transfer)
says per family whether the best rate at L2 is within one grid step of the
best at L10, and what reusing it costs at L10; measured results:
bench/results/lr_transfer.md.  ``depthbench sweep --transfer-lr-from 2`` runs
the same grid tuned at L2 only.
"""

from depthbench.configs import quickstart

FAMILIES = ("pre_ln", "hc+sum_then_norm", "attnres_full", "completep", "completep+lr_rule",
            "completep+depth_mup", "completep+depth_mup+lr_rule")
DEPTHS = (2, 10)  # the micro suite's shallowest and deepest shapes
LRS = (1e-3, 3e-3, 1e-2, 3e-2)


def get_config():
    c = quickstart.get_config()
    c.name = "micro_lr_transfer"
    return c


def get_sweep():
    return [{"model.family": f, "model.depth": depth, "train.lr": lr}
            for f in FAMILIES for depth in DEPTHS for lr in LRS]
