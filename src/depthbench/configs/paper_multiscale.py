"""The paper's multi-scale suites: ~200M, ~300M and ~500M total, three depths each.

    depthbench sweep --config paper_multiscale --workdir runs/multiscale \\
        --config.data.paths='/data/fineweb_edu/*.npy'

spec/shapes_and_recipe.md's paper-200m, -300m and -500m with the 400M recipe
and grid; 20 tokens per parameter of each budget, so steps are set per run."""

from depthbench import shapes
from depthbench.configs import paper_400m as paper
from depthbench.formatting import run_name

SUITES = ("paper-200m", "paper-300m", "paper-500m")


def get_config():
    return paper.paper_config(SUITES[0])


def get_sweep():
    runs = []
    for suite in SUITES:
        s = shapes.suite(suite)
        for entry in paper.paper_sweep(suite):
            entry = {"model.suite": suite, **entry}
            # The step count follows from the suite; keep it out of the run name.
            runs.append({"name": run_name(entry), **entry,
                         "train.steps": paper.steps_for(s.budget)})
    return runs
