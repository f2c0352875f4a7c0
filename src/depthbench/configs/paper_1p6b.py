"""The paper's largest suite: ~1.6B total parameters with grouped-query attention.

    launch/tpu_sweep.sh --config paper_1p6b --workdir gs://B/1p6b \\
        --tpu NAME --zone ZONE --accelerator v5p-128 --create --stage-data gs://B/fineweb_edu \\
        -- --config.data.paths='/tmp/depthbench-data/*.npy'

spec/shapes_and_recipe.md, paper-1p6b (L 28, 40, 54), with the 400M recipe and
grid, 20 tokens per parameter; weights and Adam moments are sharded (FSDP)."""

from depthbench.configs import paper_400m as paper

SUITE = "paper-1p6b"


def get_config():
    c = paper.paper_config(SUITE)
    c.parallel.data = 1
    c.parallel.fsdp = -1
    return c


def get_sweep():
    return paper.paper_sweep(SUITE)
