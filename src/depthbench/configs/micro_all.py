"""Every registered residual family x every depth of the micro suite.

    depthbench sweep --config micro_all --workdir runs/micro_all
    launch/local_sweep.sh --config micro_all --workdir runs/micro_all --procs 4

Families come from the registry, so a newly registered family joins without an
edit here; the recipe is the quickstart's, with a longer run."""

from depthbench import shapes
from depthbench.configs import quickstart
from depthbench.model.residual.protocol import registry

DEPTHS = tuple(s.depth for s in shapes.suite("micro").shapes())
LRS = (3e-3,)  # add 1e-3, 1e-2 for a learning-rate grid (3x the runs)


def get_config():
    c = quickstart.get_config()
    c.name = "micro_all"
    c.train.steps = 300
    c.train.eval_every = c.train.steps
    c.train.layer_stats_every = c.train.steps
    c.train.checkpoint_every = 100
    return c


def get_sweep():
    return [{"model.family": f, "model.depth": depth, "train.lr": lr}
            for f in registry.names() for depth in DEPTHS for lr in LRS]
