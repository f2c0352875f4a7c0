"""The paper's main suite: ten designs x 7 aspect ratios x 4 learning rates at ~400M.

    launch/tpu_sweep.sh --config paper_400m --workdir gs://BUCKET/400m \\
        --tpu NAME --zone ZONE --stage-data gs://BUCKET/fineweb_edu \\
        -- --config.data.paths='/tmp/depthbench-data/*.npy'
    depthbench sweep --config paper_400m --workdir runs/400m \\
        --config.data.paths='/data/fineweb_edu/*.npy' --shard 0/8

The recipe of spec/shapes_and_recipe.md (280 runs, 8B tokens each) on
pre-tokenised GPT-NeoX shards (docs/DATA.md), with the original's precision:
bf16 weights and no fp32 master copy (docs/ORIGINAL.md, "Precision").  The
other paper specs reuse ``paper_config``."""

import math

from depthbench import shapes
from depthbench.configs import base

DESIGNS = ("pre_ln", "sandwich_ln", "lns", "deepnorm", "keel", "hc", "mhc", "attnres_full",
           "attnres_block", "moda")
LRS = (5e-4, 1e-3, 2e-3, 5e-3)
BATCH = 512
SEQ_LEN = 2048
TOKENS_PER_PARAM = 20
SUITE = "paper-400m"


def steps_for(budget: float, batch: int = BATCH, seq_len: int = SEQ_LEN) -> int:
    """Optimizer steps for 20 tokens per parameter of ``budget``."""
    return math.ceil(TOKENS_PER_PARAM * budget / (batch * seq_len))


def paper_config(suite: str, *, batch: int = BATCH, seq_len: int = SEQ_LEN):
    """The paper-scale recipe for one suite (the first depth of its table)."""
    s = shapes.suite(suite)
    c = base.get_config()
    c.name = suite
    m = c.model
    m.suite = suite
    m.fix = s.fix
    m.depth = s.rows[0][0]
    m.vocab_size = s.vocab_size
    m.n_heads = 0  # the suite's heads (16; GQA with 8 KV heads at 1.6B)
    m.n_kv_heads = 0
    m.compute_dtype = "bfloat16"
    m.param_dtype = "bfloat16"  # the original's: bf16 weights, no fp32 master copy
    d = c.data
    d.corpus = "tokens"
    d.paths = ""  # required: --config.data.paths='/data/*.npy' (local files on every host)
    d.tokens_dtype = "uint16"  # vocabulary 50280 < 2**16
    d.eos_id = 0  # GPT-NeoX tokenizer's <|endoftext|>
    d.val_fraction = 0.001  # held-out documents: ~8M tokens at 8B
    d.val_windows = 512  # 1M tokens per evaluation
    d.prefetch = 4
    t = c.train
    t.batch_size = batch
    t.seq_len = seq_len
    t.steps = steps_for(s.budget, batch, seq_len)
    t.lr = 2e-3  # typical best at 400M; swept per run
    # AdamW (0.9, 0.95, 1e-8), weight decay 0.1, 10% warmup, cosine to 0.1x and
    # clipping at 1.0 are base.py's defaults: the spec's recipe at every scale.
    t.log_every = 50
    t.eval_every = 500
    t.checkpoint_every = 500
    t.layer_stats_every = 500
    return c


def paper_sweep(suite: str, designs=DESIGNS, lrs=LRS):
    return [{"model.family": f, "model.depth": depth, "train.lr": lr}
            for f in designs for depth, _, _ in shapes.suite(suite).rows for lr in lrs]


def get_config():
    return paper_config(SUITE)


def get_sweep():
    return paper_sweep(SUITE)
