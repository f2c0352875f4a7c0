"""import-olmo parity: models of every design the original DepthBench trained, built
on upstream OLMo-core's own modules (pre_ln, lns, sandwich_ln are its ``default``,
``default_scaled`` and ``peri_norm`` blocks unchanged; Liger mHC runs
liger-kernel's own kernels), given random non-trivial weights and saved with
OLMo-core's checkpoint writer, import to depthbench runs whose logits
(``load_run``) are the reference's within 1e-4 relative in fp32; for the designs
a reference can train (every one), one AdamW step in each framework, with the
original's weight-decay groups, gives the same loss.

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
from depthbench.importers.olmo import import_olmo  # noqa: E402

VOCAB = 61
# One training step is compared where the loss after it can be told apart at the
# test's tolerance: every design (the upstream blocks have their own test).
STEPPED = ("deepnorm", "keel", "post_ln", "completep", "hc", "hc_early", "mhc", "mhc_tanh",
           "mhc_liger", "attnres_full", "attnres_block", "moda_pre", "moda_post")


# Liger's kernels run in Triton's interpreter on a CPU, one program instance at a
# time: one short sequence keeps its step to seconds (94 s at 4 x 17 in CI).
STEP_BATCH = {"mhc_liger": (1, 8)}


def imported(tmp_path, design: str, *, seed: int = 1, cli: bool = False):
    """(reference model, run directory) for ``design``."""
    torch.manual_seed(seed)
    model, config = original.build(design, 3, vocab=VOCAB)
    randomize(model, seed)
    step = save_step_dir(model, config, tmp_path / "ckpt",
                         train_module=original.train_module(design))
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
    departures = run.resolved["olmo"]["departures"]
    if design == "completep_width":  # its head factor is a field, its width-muP training not
        assert run.config.model.residual.completep_head_scale == pytest.approx(16 / 32)
        assert len(departures) == 1 and "width-muP init" in departures[0]
    else:
        assert departures == []  # every choice of the original is a field
    x = tokens(4)
    ref = original.logits(model, torch.as_tensor(x, dtype=torch.long)).numpy()
    assert relative(run.logits(x), ref) <= 1e-4


@pytest.mark.parametrize("design", STEPPED)
def test_one_training_step_gives_the_original_loss(tmp_path, design):
    """Loss before and after one AdamW step on the imported weights, depthbench's
    trainer against torch's AdamW on the reference (the gradients, the decay
    groups and the update all have to agree for the second loss to)."""
    model, run_dir = imported(tmp_path, design)
    run = load_run(run_dir)
    assert_same_step(run, model, tokens(5, STEP_BATCH.get(design, (4, 17))))


@pytest.mark.parametrize("design,fields", [
    ("hc_early", {"hc_write": "residual"}),
    ("mhc_tanh", {"mhc_tanh": True, "mhc_sinkhorn": "log"}),
    ("mhc", {"mhc_sinkhorn": "log", "mhc_res_layout": "in_out", "mhc_rms_eps": 1e-8,
             "readout": "norm_then_sum", "mhc_gate_decay": True}),
    ("mhc_liger", {"mhc_sinkhorn": "linear", "mhc_res_layout": "out_in", "mhc_rms_eps": 1e-6,
                   "mhc_sinkhorn_eps": 1e-6, "readout": "mean_then_norm",
                   "mhc_gate_decay": False, "mhc_phi_dtype": "bfloat16"}),
    ("attnres_block", {"attnres_block_size": 2, "attnres_partition": "size",
                       "attnres_eps": 1e-5}),
    ("moda_pre", {"moda_kv_heads": 0, "moda_norm": "pre", "moda_depth_query": "rotated"}),
])
def test_each_original_choice_lands_in_its_field(tmp_path, design, fields):
    """The import names the original's choices by their fields (the early HC
    write rule, both mHC forms ...), and the Liger form is mhc's default."""
    _, run_dir = imported(tmp_path, design)
    run = load_run(run_dir)
    assert {k: run.config.model.residual[k] for k in fields} == fields
    if design == "mhc_liger":
        from depthbench.model.residual import registry

        defaults = registry.get("mhc").config_fields()
        assert {k: defaults[k] for k in fields} == fields
        assert str(run.params["blocks"]["residual"]["phi"].dtype) == "bfloat16"
