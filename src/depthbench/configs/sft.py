"""The original DepthBench's supervised fine-tuning recipe (its eval/finetune/).

What ``depthbench finetune`` uses by default::

    depthbench finetune runs/preln-L24 --records commonsense_170k.json \\
        --workdir runs/preln-L24-sft

The parent run gives the model and tokenizer, this spec the rest (the
recipe's table: docs/FINETUNE.md, "The recipe")."""

from depthbench.configs import base


def get_config():
    c = base.get_config()
    c.name = "sft"
    c.model.compute_dtype = "bfloat16"
    t = c.train
    t.lr = 1e-4
    t.weight_decay = 0.1
    t.b1, t.b2, t.eps = 0.9, 0.95, 1e-8
    t.schedule = "linear"
    t.warmup_fraction = 0.03
    t.final_lr_fraction = 0.0
    t.clip_norm = 1.0
    t.batch_size = 128
    t.seq_len = 512  # a record of finetune.max_seq_len tokens is 511 positions: it fits
    t.seed = 42  # the epochs' shuffles (transformers' default seed)
    t.log_every = 10
    # Evaluated once at the start (the parent's held-out loss) and at the end.
    t.eval_every = 1_000_000
    t.checkpoint_every = 200
    t.layer_stats_every = 0  # the original logs them while pretraining only
    f = c.finetune
    f.layout = "padded"
    f.epochs = 3.0
    f.max_seq_len = 512
    f.val_fraction = 0.02
    f.data_seed = 42
    return c
