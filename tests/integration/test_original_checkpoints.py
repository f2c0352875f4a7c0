"""Every design against the original DepthBench's own outputs (tests/helpers/original_outputs.py).

The checkpoints in tests/fixtures/original_checkpoints/ were written by the
original's own modules and OLMo-core's own writer; the logits are its
forward's.  For each design: ``import-olmo`` reads it (no torch or olmo_core
involved) and the imported run's logits are the original's within 1e-4
relative (fp32); depthbench's gradient at the original's pre-step weights is
the original's (from its AdamW state), and depthbench's own train step from
there gives the loss of the original's stepped weights.

Integration: a model compiled per design (about 5 s each, Liger's mHC 15 s).
"""

from __future__ import annotations

import numpy as np
import original_outputs as original
import pytest

from depthbench import load_run

STEPPED = [d for d in original.DESIGNS if d not in original.NOT_STEPPED]


def test_every_design_of_the_original_has_a_fixture():
    assert set(original.DESIGNS) == {
        "pre_ln", "lns", "sandwich_ln", "deepnorm", "keel", "post_ln", "completep",
        "depth_mup", "completep_width", "hc", "mhc", "mhc_liger", "attnres_full",
        "attnres_block", "moda_pre", "moda_post"}


@pytest.mark.parametrize("design", original.DESIGNS)
def test_imported_logits_are_the_originals(tmp_path, design):
    run = load_run(original.import_run(design, tmp_path / "run"))
    tok = original.tokens(design)
    ref = original.reference_logits(design)
    ours = run.logits(tok)
    assert ours.shape == ref.shape == (2, 17, 128)
    assert original.relative(ours, ref) <= 1e-4
    olmo = run.resolved["olmo"]
    assert olmo["step"] == 1 and olmo["dtypes"] == (
        ["bfloat16", "float32"] if design == "mhc_liger" else ["float32"])
    if design in ("hc", "mhc"):  # the fixtures are the original's final code: it says so
        assert olmo["form"]["form"] == "final" and olmo["form"]["certain"]


@pytest.mark.parametrize("design", STEPPED)
def test_one_step_from_the_import_is_the_originals(tmp_path, design):
    run = load_run(original.import_run(design, tmp_path / "run"))
    step = original.step_against_the_original(design, run)
    assert step["grad"] <= 1e-4, step  # the gradient at the original's pre-step weights
    assert step["loss_after"] < step["loss_before"] - 0.1  # the step moved the loss
    assert step["loss_after"] == pytest.approx(step["ref_after"], rel=1e-5), step


def test_the_other_hc_form_is_not_the_original_final_code(tmp_path):
    """The fixtures tell the forms apart: the early form (residual write, each
    stream normed) read into the final code's weights is far from its logits."""
    run = load_run(original.import_run("hc", tmp_path / "run", hc_form="early"))
    assert run.config.model.residual.readout == "norm_then_sum"
    assert original.relative(run.logits(original.tokens("hc")),
                             original.reference_logits("hc")) > 0.5


def test_depth_width_runs_record_their_departure(tmp_path):
    run = load_run(original.import_run("completep_width", tmp_path / "run"))
    departures = run.resolved["olmo"]["departures"]
    assert len(departures) == 1 and "width-muP init" in departures[0]
    assert run.config.model.residual.completep_head_scale == pytest.approx(24 / 48)
    assert np.isfinite(run.logits(original.tokens("completep_width"))).all()


BLOCK_IMPORTS = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "olmo_core"):
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Absent())
from depthbench.cli import main
rc = main(sys.argv[1:])
assert not any(m.split(".")[0] in ("torch", "olmo_core") for m in sys.modules), "imported"
sys.exit(rc)
"""


def test_import_olmo_runs_where_neither_torch_nor_olmo_core_imports(tmp_path):
    """A user's machine without olmo_core (or torch): the command imports the
    original's hc checkpoint, whose .metadata pickles an olmo_core class."""
    import subprocess
    import sys

    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", BLOCK_IMPORTS, "import-olmo",
                           str(original.step_dir("hc")), "--out", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "hc (original block 'hc', step 1)" in proc.stdout
    run = load_run(out)
    assert original.relative(run.logits(original.tokens("hc")),
                             original.reference_logits("hc")) <= 1e-4
