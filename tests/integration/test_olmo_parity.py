"""import-olmo parity where the original's own checkpoints do not decide (tests/olmo_reference).

tests/integration/test_original_checkpoints.py tests every design against the
original's own checkpoints and logits.  This file adds what those cannot: upstream
OLMo-core's own pre_ln, lns and sandwich_ln blocks (another release, its writer);
mHC with its routing far from init, where the Sinkhorn forms and layouts differ
(the fixtures' sit at init, saturated), in the PyTorch form and in Liger's, run
by liger-kernel's own kernels; and the early forms of HC and mHC the fixtures do
not have.  Each is saved with OLMo-core's checkpoint writer, imported, and its
logits (``load_run``) are the reference's within 1e-4 relative in fp32; one AdamW
step in each framework, with the original's weight-decay groups, gives the same
loss.

In-process, but against another framework's reference and Liger's kernels in
Triton's interpreter (minutes), hence integration; needs the ``test-olmo`` extra.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the test-olmo extra")
pytest.importorskip("olmo_core", reason="needs the test-olmo extra (ai2-olmo-core)")

from olmo_reference import original  # noqa: E402
from olmo_reference.step_dir import randomize, save_step_dir  # noqa: E402
from olmo_reference.training import depthbench_step, torch_step  # noqa: E402

from depthbench import load_run  # noqa: E402
from depthbench.cli import main as cli_main  # noqa: E402
from depthbench.formats.olmo.step_dir import import_olmo  # noqa: E402

VOCAB = 61
# One training step in each framework (the upstream blocks have their own test).
STEPPED = ("hc_early", "mhc", "mhc_tanh", "mhc_liger")


# Liger's kernels run in Triton's interpreter on a CPU, one program instance (one
# token) at a time, its Sinkhorn kernel's 20 iterations the most of it: one short
# sequence keeps its logits and its step to seconds (the step 94 s at 4 x 17 in CI).
INTERPRETED_BATCH = {"mhc_liger": (1, 8)}


def imported(tmp_path, design: str, *, seed: int = 1, cli: bool = False):
    """(reference model, run directory) for ``design``."""
    torch.manual_seed(seed)
    model, config = original.build(design, 3, vocab=VOCAB)
    randomize(model, seed)
    step = save_step_dir(model, config, tmp_path / "ckpt")
    run_dir = tmp_path / "run"
    if cli:
        assert cli_main(["import-olmo", str(step), "--out", str(run_dir), "--no-progress"]) == 0
    else:
        import_olmo(step, run_dir, progress=False)
    return model, run_dir


def relative(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def tokens(seed: int, shape=(2, 13)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=shape).astype(np.int32)


def assert_same_step(run, model, batch: np.ndarray) -> None:
    """One AdamW step (lr 1e-2) in each framework: the same loss before, and after."""
    ours_before, ours_after = depthbench_step(run, batch, lr=1e-2)
    ref_before, ref_after = torch_step(model, batch, lr=1e-2)
    assert ref_after < ref_before - 1e-3  # the step moved the loss: the check can fail
    assert ours_before == pytest.approx(ref_before, rel=1e-5)
    assert ours_after == pytest.approx(ref_after, rel=1e-4)


@pytest.mark.parametrize("design", ["pre_ln", "lns", "sandwich_ln"])
def test_upstream_blocks_logits_and_one_step(tmp_path, design):
    model, run_dir = imported(tmp_path, design, cli=True)
    run = load_run(run_dir)
    assert run.spec.family == design and run.step == 0
    x = tokens(2)
    ref = original.logits(model, torch.as_tensor(x, dtype=torch.long)).numpy()
    ours = run.logits(x)
    assert ours.shape == ref.shape == (2, 13, VOCAB)
    assert relative(ours, ref) <= 1e-4
    assert_same_step(run, model, tokens(3, (4, 17)))


@pytest.mark.parametrize("design", [d for d in original.DESIGNS if d not in original.UPSTREAM])
def test_family_logits_match_the_original(tmp_path, design):
    model, run_dir = imported(tmp_path, design)
    run = load_run(run_dir)
    assert run.resolved["olmo"]["departures"] == []  # every choice of the original is a field
    x = tokens(4, INTERPRETED_BATCH.get(design, (2, 13)))
    ref = original.logits(model, torch.as_tensor(x, dtype=torch.long)).numpy()
    assert relative(run.logits(x), ref) <= 1e-4


@pytest.mark.parametrize("design", STEPPED)
def test_one_training_step_gives_the_original_loss(tmp_path, design):
    """Loss before and after one AdamW step on the imported weights, depthbench's
    trainer against torch's AdamW on the reference (the gradients, the decay
    groups and the update all have to agree for the second loss to)."""
    model, run_dir = imported(tmp_path, design)
    run = load_run(run_dir)
    assert_same_step(run, model, tokens(5, INTERPRETED_BATCH.get(design, (4, 17))))


@pytest.mark.parametrize("design,fields", [
    ("hc_early", {"hc_write": "residual", "readout": "norm_then_sum"}),
    ("mhc_tanh", {"mhc_tanh": True, "mhc_sinkhorn": "log", "readout": "norm_then_sum"}),
    ("mhc", {"mhc_sinkhorn": "log", "mhc_res_layout": "in_out", "mhc_rms_eps": 1e-8,
             "readout": "sum_then_norm", "mhc_gate_decay": True}),
    ("mhc_liger", {"mhc_sinkhorn": "linear", "mhc_res_layout": "out_in", "mhc_rms_eps": 1e-6,
                   "mhc_sinkhorn_eps": 1e-6, "readout": "mean_then_norm",
                   "mhc_gate_decay": False, "mhc_phi_dtype": "bfloat16"}),
])
def test_each_original_choice_lands_in_its_field(tmp_path, design, fields):
    """The import names the original's choices by their fields (the early HC
    form, both mHC forms ...), and the Liger form is mhc's default."""
    _, run_dir = imported(tmp_path, design)
    run = load_run(run_dir)
    assert {k: run.config.model.residual[k] for k in fields} == fields
    if design == "mhc_liger":
        from depthbench.model.residual.protocol import registry

        defaults = registry.get("mhc").config_fields()
        assert {k: defaults[k] for k in fields} == fields
        assert str(run.params["blocks"]["residual"]["phi"].dtype) == "bfloat16"


def test_an_early_hc_checkpoint_says_which_form_it_chose(tmp_path, capsys):
    """config.py@5152cab saved the same fields as later hc checkpoints but for
    ``tanh``; the import reads the early form from it and says so (stdout), and
    ``--hc-form final`` imports the other."""
    _, run_dir = imported(tmp_path, "hc_early", cli=True)
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("  hc form: early (hyper_connections.tanh is saved")
    assert line.endswith("--hc-form final imports the final form")
    assert load_run(run_dir).resolved["olmo"]["form"]["certain"] is False
