"""The paper's Kaplan-style suite: backbone (non-embedding) parameters fixed at ~300M.

Depths 16, 24, 32, 42, 70, 84 (aspect ratios 78 .. 6.5; spec/shapes_and_recipe.md,
paper-300m-backbone), the ten designs, the 400M recipe and learning-rate grid;
20 tokens per backbone parameter (6B tokens, 5723 steps of 512 x 2048).

    depthbench sweep --config paper_300m_backbone --workdir runs/300m-bb \\
        --config.data.paths='/data/fineweb_edu/*.npy'
"""

from depthbench.configs import paper_400m as paper

SUITE = "paper-300m-backbone"


def get_config():
    return paper.paper_config(SUITE)


def get_sweep():
    return paper.paper_sweep(SUITE)
