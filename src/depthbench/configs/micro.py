"""One pre_ln model of the micro suite, trained on the bundled micro corpus.

    depthbench train --config micro --workdir runs/demo
    tensorboard --logdir runs/demo/tb

The run a new user starts with (a few minutes on a 2-core CPU); Ctrl-C and
the same command again resume it exactly."""

from depthbench.configs import base


def get_config():
    c = base.get_config()
    c.name = "micro"
    c.model.family = "pre_ln"
    c.model.suite = "micro"  # ~1.2M parameters, 4 heads, vocabulary 2048
    c.model.depth = 4  # d_model 120, aspect ratio 30
    # Keep every matmul output, recompute only elementwise work in the
    # backward: faster on CPU than keeping everything (remat "none"), and no
    # matmul runs twice (model/transformer.py, OWN_POLICIES).
    c.model.remat_policy = "matmuls_saveable"
    c.data.corpus = "micro"
    t = c.train
    t.steps = 300
    t.batch_size = 16
    t.seq_len = 128
    t.lr = 3e-3
    t.log_every = 10
    t.eval_every = 100
    t.checkpoint_every = 50
    t.layer_stats_every = 100
    return c
