"""The paper's multi-scale suites: ~200M, ~300M and ~500M total, three depths each.

spec/shapes_and_recipe.md: paper-200m (L 12, 18, 24), paper-300m (14, 21, 28),
paper-500m (17, 26, 34), aspect ratios ~76, ~43, ~28 at every scale.  The
400M recipe and learning-rate grid; each scale trains 20 tokens per parameter
of its budget (4B, 6B, 10B tokens), so the step count is set per run.

    depthbench sweep --config paper_multiscale --workdir runs/multiscale \\
        --config.data.paths='/data/fineweb_edu/*.npy'
"""

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
