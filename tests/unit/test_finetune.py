"""Fine-tuning's pieces, known answers: the masked loss and its gradient, the
linear schedule, the row plans, the rows as arrays, the held-out loss.

(The command end to end, resume, memorisation, readers and sweeps:
tests/integration/test_finetune_runs.py.)
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from depthbench import config as config_lib
from depthbench import parallel
from depthbench.config import ConfigError
from depthbench.finetune import plan as rows
from depthbench.finetune.plan import RowReader, Validation, supervised_per_record
from depthbench.model import transformer
from depthbench.train import optim
from depthbench.train import state as state_lib
from depthbench.train import step as step_lib

VOCAB = 64
TINY = ["model.suite=", "model.d_model=32", "model.d_ff=64", "model.depth=2", "model.n_heads=4",
        f"model.vocab_size={VOCAB}", "model.remat_policy=none", "train.seq_len=8",
        "train.batch_size=4", "train.steps=10"]


@pytest.fixture(scope="module")
def setup():
    mesh = parallel.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
    s = state_lib.setup(config_lib.load(config_lib.base_spec_path(), TINY), mesh)
    return s, state_lib.init_state(s, 0).params


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, VOCAB, (4, 9)).astype(np.int32)
    mask = np.zeros((4, 8), bool)
    mask[0, 5:], mask[1, 2:4], mask[2, 7] = True, True, True  # row 3: nothing supervised
    return {"inputs": toks[:, :-1], "targets": toks[:, 1:], "mask": mask}


def _loss_and_grads(s, params, batch, microbatches):
    fn = jax.jit(lambda p, b: step_lib.grads_and_loss(s, p, b, jax.random.key(0), microbatches))
    with s.context():
        return jax.device_get(fn(params, batch))


@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_prompt_tokens_target_changes_nothing_in_the_loss_or_gradient(setup, microbatches):
    s, params = setup
    batch = _batch()
    loss, grads = _loss_and_grads(s, params, batch, microbatches)
    moved = dict(batch, targets=batch["targets"].copy())
    moved["targets"][~batch["mask"]] = (moved["targets"][~batch["mask"]] + 7) % VOCAB
    loss2, grads2 = _loss_and_grads(s, params, moved, microbatches)
    assert loss2 == loss  # bitwise
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(grads),
                                                    jax.tree.leaves(grads2), strict=True))
    # A supervised target does change it, and the loss is the mean over the
    # batch's supervised tokens (not a mean of the micro-batches' means).
    moved["targets"][0, 6] = (moved["targets"][0, 6] + 1) % VOCAB
    assert _loss_and_grads(s, params, moved, microbatches)[0] != loss
    with s.context():
        logits, _ = s.model.apply({"params": params}, batch["inputs"])
    expect = transformer.cross_entropy(logits, batch["targets"], batch["mask"])
    assert loss == pytest.approx(float(expect), rel=2e-6)


def test_without_a_mask_the_loss_is_every_tokens_mean(setup):
    s, params = setup
    batch = {k: v for k, v in _batch().items() if k != "mask"}
    loss, _ = _loss_and_grads(s, params, batch, 1)
    with s.context():
        logits, _ = s.model.apply({"params": params}, batch["inputs"])
    assert loss == float(transformer.cross_entropy(logits, batch["targets"]))


def test_warmup_linear_known_values():
    lr = optim.warmup_linear(1e-4, steps=100, warmup_fraction=0.03, final_fraction=0.0)
    expect = {0: 0.0, 1: 1e-4 / 3, 3: 1e-4, 50: 1e-4 * 50 / 97, 100: 0.0, 120: 0.0}
    for step, value in expect.items():
        assert float(lr(step)) == pytest.approx(value, rel=1e-5, abs=1e-12), step
    c = config_lib.base_config()
    c.train.update(schedule="linear", lr=2e-3, steps=10, warmup_fraction=0.0,
                   final_lr_fraction=0.5)
    assert float(optim.schedule_from_config(c)(5)) == pytest.approx(1.5e-3)
    c.train.schedule = "cosine"  # the default is what it was
    assert float(optim.schedule_from_config(c)(5)) == float(
        optim.warmup_cosine(2e-3, 10, 0.0, 0.5)(5))


def test_epochs_are_fresh_shuffles_and_packing_is_greedy_in_order():
    order = rows.epoch_order(5, 2.5, seed=3)
    assert order.tolist() == [*np.random.default_rng(3).permutation(5),
                              *np.random.default_rng(4).permutation(5),
                              *np.random.default_rng(5).permutation(5)[:3]]
    positions = np.array([3, 5, 2, 4, 1])  # record i has positions[i] positions
    plan = rows.lay_out(np.array([0, 1, 2, 3, 4, 0]), positions, 8, "packed")
    assert [plan.row(r).tolist() for r in range(plan.rows)] == [[0, 1], [2, 3, 4], [0]]
    assert plan.steps(2) == 2 and plan.row(5).tolist() == []  # past the end: empty
    padded = rows.lay_out(np.array([4, 2]), positions, 8, "padded")
    assert [padded.row(r).tolist() for r in range(padded.rows)] == [[4], [2]]
    with pytest.raises(ConfigError, match=r"^config\.train\.seq_len: the longest training "
                                          r"record is 7 tokens \(6 positions\), more than a "
                                          r"row of 5; set train\.seq_len >= 6"):
        rows.training_rows(np.array([0, 4, 11]), epochs=1, seed=0, seq_len=5, layout="packed")


@pytest.fixture
def entry(tmp_path):
    """Three records (ids 10.., 20.., 30..) of 4, 3 and 5 tokens, masks known."""
    ids = np.array([10, 11, 12, 13, 20, 21, 22, 30, 31, 32, 33, 34], np.uint16)
    mask = np.array([0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 1, 1], bool)
    offsets = np.array([0, 4, 7, 12], np.int64)
    for split in ("train", "val"):
        for part, array in (("ids", ids), ("mask", mask), ("offsets", offsets)):
            np.save(tmp_path / f"{split}_{part}.npy", array)
    return tmp_path


def test_rows_as_arrays_padded_and_packed(entry):
    plan = rows.RowPlan(np.array([0, 1, 3]), np.array([2, 0, 1]))
    padded = RowReader(str(entry), "train", plan, 6, 0, packed=False)([0, 2])
    assert padded["inputs"].tolist() == [[30, 31, 32, 33, 0, 0], [0] * 6]  # row 2: empty
    assert padded["targets"][0].tolist() == [31, 32, 33, 34, 0, 0]
    assert padded["mask"][0].tolist() == [0, 0, 1, 1, 0, 0] and not padded["mask"][1].any()
    packed = RowReader(str(entry), "train", plan, 6, 0, packed=True)([1])
    assert packed["inputs"].tolist() == [[10, 11, 12, 20, 21, 0]]
    assert packed["targets"].tolist() == [[11, 12, 13, 21, 22, 0]]
    assert packed["mask"].tolist() == [[0, 1, 1, 1, 1, 0]]
    assert packed["segments"].tolist() == [[1, 1, 1, 2, 2, 0]]
    assert packed["positions"].tolist() == [[0, 1, 2, 0, 1, 0]]


def test_the_held_out_loss_weighs_each_batch_by_its_supervised_tokens(entry):
    assert supervised_per_record(np.load(entry / "val_mask.npy"),
                                 np.load(entry / "val_offsets.npy")).tolist() == [2, 2, 2]
    val = Validation(str(entry), 6, 0, packed=False, batch_size=2)
    assert val.counts.tolist() == [4, 2]  # records 0 + 1, then record 2 and an empty row
    assert len(val.batches()) == 2 and not val.batches()[1]["mask"][1].any()
    assert val.loss([1.0, 4.0]) == pytest.approx((1.0 * 4 + 4.0 * 2) / 6)


def _records_entry(root, lengths, seed=0):
    """A split of records of ``lengths`` tokens (random ids, random label masks)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, sum(lengths)).astype(np.uint16)
    mask = rng.random(sum(lengths)) < 0.6
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    for part, array in (("ids", ids), ("mask", mask), ("offsets", offsets)):
        np.save(root / f"train_{part}.npy", array)
    return offsets


@pytest.mark.parametrize("family", ["pre_ln", "attnres_full", "moda"])
def test_packed_and_padded_give_the_same_loss_and_gradient(family, tmp_path):
    """Records packed two to a row (attention kept inside each, RoPE from 0 in
    each) score as when each has a row of its own: the scan, the depth-linear
    stack (attnres) and moda's joint softmax over sequence and depth keys."""
    config = config_lib.load(config_lib.base_spec_path(), [*TINY, f"model.family={family}",
                                                           "train.seq_len=16"])
    s = state_lib.setup(config, parallel.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}))
    params = state_lib.init_state(s, 0).params
    offsets = _records_entry(tmp_path, [5, 9, 3, 7])
    order = np.arange(4)
    positions = np.diff(offsets) - 1
    batches = {}
    for layout in ("padded", "packed"):
        plan = rows.lay_out(order, positions, 16, layout)
        reader = RowReader(str(tmp_path), "train", plan, 16, 0, layout == "packed")
        batches[layout] = reader(np.arange(plan.rows))
    assert len(batches["packed"]["inputs"]) == 2  # [0, 1] and [2, 3]

    def loss(p, b):
        return step_lib.loss_fn(s, p, b, jax.random.key(0))

    fn = jax.jit(jax.value_and_grad(loss))
    with s.context():
        (a, ga), (b, gb) = (jax.device_get(fn(params, batches[k])) for k in batches)
    assert b == pytest.approx(a, rel=2e-6)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        np.testing.assert_allclose(y, x, rtol=2e-4, atol=2e-6)
    crossed = dict(batches["packed"], segments=np.ones_like(batches["packed"]["segments"]))
    with s.context():
        assert abs(float(fn(params, crossed)[0]) - a) > 1e-4  # the mask matters
