"""The bundled specs (depthbench.configs) resolve to the exact shapes and recipe of
spec/shapes_and_recipe.md (no training).  The tables below are copied from the
spec, not from depthbench.shapes, so they check the suites as well."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from paths import REPO

from depthbench import configs
from depthbench import sweep as sweeplib
from depthbench.config import ConfigError
from depthbench.data import validate as data_validate
from depthbench.model.residual.protocol import registry
from depthbench.model.spec import ModelSpec

EXPERIMENTS = Path(configs.__file__).parent  # the bundled specs
TEN = {"pre_ln", "sandwich_ln", "lns", "deepnorm", "keel", "hc", "mhc", "attnres_full",
       "attnres_block", "moda"}
LRS = {5e-4, 1e-3, 2e-3, 5e-3}
TABLES = {  # suite: (budget, [(L, d_model, d_ff)], n_kv_heads)
    "paper-400m": (400e6, "16/1216/3248 20/1120/2992 24/1024/2736 28/960/2560 32/896/2400 "
                          "42/800/2144 70/640/1712", 16),
    "paper-300m-backbone": (300e6, "16/1248/3328 24/1024/2736 32/896/2400 42/768/2048 "
                                   "70/608/1632 84/544/1456", 16),
    "paper-200m": (200e6, "12/896/2400 18/768/2048 24/672/1792", 16),
    "paper-300m": (300e6, "14/1056/2816 21/896/2400 28/800/2144", 16),
    "paper-500m": (500e6, "17/1344/3584 26/1120/2992 34/992/2656", 16),
    "paper-1p6b": (1.6e9, "28/2048/6144 40/1728/5184 54/1504/4512", 8),
}
SPECS = {
    "paper_400m.py": ["paper-400m"],
    "paper_300m_backbone.py": ["paper-300m-backbone"],
    "paper_multiscale.py": ["paper-200m", "paper-300m", "paper-500m"],
    "paper_1p6b.py": ["paper-1p6b"],
}


def rows(suite: str) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in r.split("/")) for r in TABLES[suite][1].split()]


@pytest.fixture(scope="module", params=list(SPECS))
def paper(request):
    return request.param, sweeplib.expand(EXPERIMENTS / request.param)


def test_paper_spec_runs_are_the_spec_shapes_designs_and_lrs(paper):
    spec_name, sweep = paper
    suites = SPECS[spec_name]
    expected = {(suite, f, L, lr) for suite in suites for f in TEN for (L, _, _) in rows(suite)
                for lr in LRS}
    got = {(r.config.model.suite, r.config.model.family, r.config.model.depth,
            r.config.train.lr) for r in sweep.runs}
    assert got == expected and len(sweep.runs) == len(expected)
    for run in sweep.runs:
        suite = run.config.model.suite
        m = ModelSpec.from_config(run.config)
        table = {L: (d, ff) for L, d, ff in rows(suite)}
        assert (m.d_model, m.d_ff) == table[m.depth], run.name
        assert (m.n_heads, m.n_kv_heads, m.vocab_size) == (16, TABLES[suite][2], 50280)


def test_paper_spec_recipe(paper):
    spec_name, sweep = paper
    for run in sweep.runs:
        c = run.config
        t = c.train
        budget = TABLES[c.model.suite][0]
        assert (t.batch_size, t.seq_len) == (512, 2048)
        # 20 tokens per parameter of the suite's budget (400M: 8B tokens, ~7.6k steps).
        assert t.steps == math.ceil(20 * budget / (512 * 2048))
        assert (t.b1, t.b2, t.eps, t.weight_decay, t.clip_norm) == (0.9, 0.95, 1e-8, 0.1, 1.0)
        assert (t.warmup_fraction, t.final_lr_fraction) == (0.1, 0.1)
        # The original's precision: bf16 weights, no fp32 master copy.
        assert (c.model.compute_dtype, c.model.param_dtype) == ("bfloat16", "bfloat16")
        assert (c.data.corpus, c.data.paths) == ("tokens", "")
    if spec_name == "paper_400m.py":
        assert {r.config.train.steps for r in sweep.runs} == {7630}
        ars = sorted({round(r.shape.aspect_ratio, 2) for r in sweep.runs}, reverse=True)
        assert ars == [76.0, 56.0, 42.67, 34.29, 28.0, 19.05, 9.14]
    if spec_name == "paper_1p6b.py":
        assert all(r.shape.d_ff == 3 * r.shape.d_model for r in sweep.runs)
        assert {(r.config.parallel.data, r.config.parallel.fsdp) for r in sweep.runs} == {(1, -1)}


def test_paper_run_names(paper):
    spec_name, sweep = paper
    run = sweep.runs[0]
    if spec_name == "paper_multiscale.py":
        assert run.name == "pre_ln-200m-L12-lr5e-04"  # the step count stays out of the name
        assert run.config.name == run.name
    else:
        L = rows(SPECS[spec_name][0])[0][0]
        assert run.name == f"pre_ln-L{L}-lr5e-04"


def test_paper_data_comes_from_the_command_line(tmp_path):
    sweep = sweeplib.expand(EXPERIMENTS / "paper_400m.py")
    with pytest.raises(ConfigError, match="config.data.paths: empty"):
        data_validate.validate_config(sweep.runs[0].config)
    shard = tmp_path / "train_000.npy"
    np.save(shard, np.arange(1000, dtype=np.uint16))
    given = sweeplib.expand(EXPERIMENTS / "paper_400m.py",
                            [f"--config.data.paths={tmp_path}/train_*.npy"])
    data_validate.validate_config(given.runs[0].config)  # accepted as given
    assert given.runs[0].config.data.eos_id == 0


def test_quickstart_is_the_micro_sweep():
    sweep = sweeplib.expand(EXPERIMENTS / "quickstart.py")
    families = {r.static_row()["family"] for r in sweep.runs}
    # hc+norm_then_sum: hc with the original's earlier readout, n x pre_ln at init (the
    # control: hc's own readout matches pre_ln at init).
    assert {"pre_ln", "hc", "hc+norm_then_sum", "mhc", "attnres_full"} <= families
    ars = sorted({r.shape.aspect_ratio for r in sweep.runs}, reverse=True)
    assert len(ars) >= 3 and ars[0] == 76.0 and ars[-1] <= 9.5
    assert len(sweep.runs) == len(families) * len(ars)
    c = sweep.runs[0].config
    assert (c.model.suite, c.data.corpus) == ("micro", "micro")
    assert all(abs(r.shape.total_params - 1.2e6) / 1.2e6 < 0.1 for r in sweep.runs)


def test_micro_all_is_every_family_times_the_micro_suite():
    sweep = sweeplib.expand(EXPERIMENTS / "micro_all.py")
    got = {(r.config.model.family, r.config.model.depth) for r in sweep.runs}
    assert got == set(itertools.product(registry.names(), (2, 3, 4, 6, 8, 10)))
    assert len(sweep.runs) == len(got)


def test_micro_depth_is_three_families_at_three_aspect_ratios_of_one_parameter_count():
    """experiments/micro_depth.py, the laptop depth suite: aspect ratios 60, 22
    and 8 within 0.3% of one parameter count, 12.3M tokens a run."""
    sweep = sweeplib.expand(REPO / "experiments" / "micro_depth.py")
    got = {(dict(r.overrides)["model.family"], r.config.model.depth) for r in sweep.runs}
    assert got == set(itertools.product(("pre_ln", "attnres_full", "hc+sum_then_norm"),
                                        (2, 4, 8)))
    assert len(sweep.runs) == len(got)
    pre_ln = {r.shape.depth: r.shape for r in sweep.runs if r.config.model.family == "pre_ln"}
    assert {L: s.d_model for L, s in pre_ln.items()} == {2: 120, 4: 88, 8: 64}
    counts = [s.total_params for s in pre_ln.values()]
    assert max(counts) / min(counts) < 1.003
    c = sweep.runs[0].config
    assert (c.model.vocab_size, c.data.corpus) == (512, "micro")
    assert c.train.steps * c.train.batch_size * c.train.seq_len == 12_288_000
