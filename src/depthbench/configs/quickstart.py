"""The micro sweep a new user runs first (15 runs, about 9 minutes on a 2-core CPU).

Four residual families, and hc's readout control, x three aspect ratios of
the micro suite (~1.2M parameters, 4 heads, vocabulary 2048), trained on the
bundled micro corpus:

    depthbench sweep --config quickstart --workdir runs/quickstart
    depthbench report runs/quickstart

Depths 2, 4 and 10 give aspect ratios 76, 30 and 8: the span of the paper's
400M suite (76 down to 9.1), so the plot has the paper's axes.  Every run is
the same short recipe at one learning rate (~150k tokens: the families are
compared early in training); micro_all.py is the full suite.

``hc+norm_then_sum`` is the control for a confound: hc reads out as the
original's final code does (``sum_then_norm``, ``N_out(sum_s H[s])``, equal to
pre_ln at init), while its earlier code normalised each stream before summing
(``norm_then_sum``, ``sum_s N_out(H[s])``), whose logits start exactly ``n =
4`` times pre_ln's; early in training that larger logit scale alone lowers the
loss.  The pair shows how much of hc's lead is its routing and how much the
earlier readout's scale.  mhc is the original's Liger mHC, whose mean readout
has no such scale.

attnres_block is left out on purpose: with the original's partition (``S =
ceil(2L / 8)`` sublayers per block) it equals attnres_full at L2 and L4, so it would add 20% to
the time for one new point; add it to FAMILIES to see it at L10.
"""

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
