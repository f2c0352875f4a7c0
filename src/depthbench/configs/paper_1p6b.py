"""The paper's largest suite: ~1.6B total parameters with grouped-query attention.

spec/shapes_and_recipe.md, paper-1p6b: 16 query heads, 8 KV heads,
d_ff = 3 d, depths 28, 40, 54 (aspect ratios 73, 43, 28).  The 400M recipe
and learning-rate grid; 20 tokens per parameter (32B tokens, 30518 steps of
512 x 2048).  At this size fp32 weights and Adam moments (~26 GB) are
sharded over the chips (FSDP) instead of replicated.

    launch/tpu_sweep.sh --config paper_1p6b --workdir gs://B/1p6b \\
        --tpu NAME --zone ZONE --accelerator v5p-128 --create --stage-data gs://B/fineweb_edu \\
        -- --config.data.paths='/tmp/depthbench-data/*.npy'
"""

from depthbench.configs import paper_400m as paper

SUITE = "paper-1p6b"


def get_config():
    c = paper.paper_config(SUITE)
    c.parallel.data = 1
    c.parallel.fsdp = -1
    return c


def get_sweep():
    return paper.paper_sweep(SUITE)
