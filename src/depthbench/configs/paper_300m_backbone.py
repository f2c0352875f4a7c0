"""The paper's Kaplan-style suite: backbone (non-embedding) parameters fixed at ~300M.

    depthbench sweep --config paper_300m_backbone --workdir runs/300m-bb \\
        --config.data.paths='/data/fineweb_edu/*.npy'

spec/shapes_and_recipe.md, paper-300m-backbone (L 16 .. 84), with the 400M
recipe and grid, 20 tokens per backbone parameter."""

from depthbench.configs import paper_400m as paper

SUITE = "paper-300m-backbone"


def get_config():
    return paper.paper_config(SUITE)


def get_sweep():
    return paper.paper_sweep(SUITE)
