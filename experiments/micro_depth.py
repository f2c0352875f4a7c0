"""A laptop suite where depth shows: which shapes do pre_ln and the depth-routing families prefer?

    launch/local_sweep.sh --config experiments/micro_depth.py --workdir runs/micro_depth --procs 2
    depthbench report runs/micro_depth

9 runs, about 1.5 to 2 hours on a 2-core CPU with two processes; the report's
"Loss at equal compute" section gives each family's best aspect ratio at equal
tokens and at equal training FLOPs.  The quickstart compares families after
150k tokens, where every family prefers the shallowest shape.  Here the model
is smaller (a ~470k-parameter budget with a 512-piece vocabulary, so the
embeddings do not take the budget) and trains 80x longer: 6,000 steps of
16 x 128 tokens, 12.3M tokens, ~26 tokens per parameter (2.3 passes over the
micro corpus at this vocabulary), evaluated every 300 steps for the curves.

Depths 2, 4 and 8 give d_model 120, 88 and 64, aspect ratios 60, 22 and 8
(the paper's 400M suite spans 76 to 9.1), within 0.3% of one parameter count;
depths 3 and 6 are 8% over and 4% under it at this budget, enough to decide a
comparison this close (bench/results/micro_depth.md), so they are left out.
pre_ln against the two families that route through depth: attnres_full
(softmax attention over every earlier sublayer output) and hc with the
``sum_then_norm`` readout (equal to pre_ln at init: quickstart.py says why).
One learning rate, 3e-3 (the best of micro_lr_transfer.py's grid at the
shallow end for all three), and one seed.  Measured: at this budget pre_ln and
attnres_full do best at aspect ratio 8 (L8) and hc+sum_then_norm at 60 (L2);
at 3.1M and 6.1M tokens all three did best at 22 (L4).  pre_ln's best ratio is
never shallower than the other two's here: the paper's split needs more layers
than a laptop budget allows (results, curves and why: bench/results/micro_depth.md;
README, "Where depth shows").
"""
from depthbench.configs import quickstart

FAMILIES = ("pre_ln", "attnres_full", "hc+sum_then_norm")
DEPTHS = (2, 4, 8)  # budget 4.7e5, vocabulary 512: d_model 120, 88, 64 -> aspect ratios 60, 22, 8
LRS = (3e-3,)


def get_config():
    c = quickstart.get_config()  # the micro corpus, 128-token windows, lr 3e-3
    c.name = "micro_depth"
    m = c.model
    m.suite = ""  # shapes from the budget rule, not a named suite
    m.budget = 5e5  # the shape rule's closest widths: 469k, 468k and 468k parameters
    m.vocab_size = 512
    m.n_heads = 4
    t = c.train
    t.steps = 6000
    t.batch_size = 16
    t.log_every = 50
    t.eval_every = 300
    t.checkpoint_every = 1000
    return c


def get_sweep():
    return [{"model.family": f, "model.depth": depth, "train.lr": lr}
            for depth in DEPTHS for f in FAMILIES for lr in LRS]
