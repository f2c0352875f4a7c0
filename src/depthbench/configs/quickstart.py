"""The micro sweep a new user runs first (15 runs, about 9 minutes on a 2-core CPU).

    depthbench sweep --config quickstart --workdir runs/quickstart
    depthbench report runs/quickstart

Four families and hc's readout control (``hc+norm_then_sum``: the README's
"hc's early lead") x depths 2, 4 and 10 of the micro suite, aspect ratios 76
to 8 like the paper's 400M suite, one short recipe on the micro corpus.
attnres_block is left out: with the original's partition it equals
attnres_full at L2 and L4."""

from depthbench.configs import base

FAMILIES = ("pre_ln", "hc", "hc+norm_then_sum", "mhc", "attnres_full")
DEPTHS = (2, 4, 10)  # micro suite: d_model 152, 120, 80 -> aspect ratios 76, 30, 8
LRS = (3e-3,)


def get_config():
    c = base.get_config()
    c.name = "quickstart"
    c.model.suite = "micro"
    c.data.corpus = "micro"
    t = c.train
    # Time, not tokens, is the budget here: smaller batches buy more optimizer
    # steps for the same compute, which is what early training rewards.
    t.steps = 150
    t.batch_size = 8
    t.seq_len = 128
    t.lr = LRS[0]
    t.log_every = 10
    # One evaluation, at the end: the sweep compares final validation losses.
    t.eval_every = t.steps
    t.checkpoint_every = 75
    t.layer_stats_every = 0  # no per-block statistics: saves a compile per run
    return c


def get_sweep():
    return [{"model.family": f, "model.depth": depth, "train.lr": lr}
            for f in FAMILIES for depth in DEPTHS for lr in LRS]
