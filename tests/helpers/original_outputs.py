"""The original DepthBench's own outputs, and depthbench's against them.

``tests/fixtures/original_checkpoints/<design>/`` holds what the original's own
code wrote (its SOURCE_README.md says how): a checkpoint saved by OLMo-core's
writer after one AdamW step, the token ids ``tok.npy [2, 17]`` and the
original's fp32 logits ``ref.npy [2, 17, V]`` of the saved weights.  Nothing
here re-implements the original; what is compared:

* **logits**: the imported run's on ``tok`` against ``ref``;
* **the step**: the checkpoint's optimizer state after that one step gives
  the original's gradient, ``g = exp_avg / (1 - b1)``, and its weights before
  the step: torch's AdamW took ``p1 = p0 (1 - lr wd) - lr g / (|g| + eps)``
  (``sqrt(v_hat) = |g|`` at step 1) with each parameter's group's ``lr``,
  ``wd`` and ``eps`` (``optim.param_groups``), so ``p0 = (p1 + lr g / (|g| +
  eps)) / (1 - lr wd)``.  depthbench's gradient at ``p0`` on the next-token
  loss of ``tok`` is compared with ``g``, and depthbench's own train step from
  ``p0`` (its optimizer, decay groups and the run's learning-rate rule, at the
  original's ``lr``, betas and ``eps``, no clipping: the original's step clipped
  nothing) must give the loss of the original's stepped weights, the cross
  entropy of ``ref``.

Used by tests/integration/test_original_checkpoints.py; run as a script it
prints docs/ORIGINAL.md's table (``python tests/helpers/original_outputs.py [DESIGN ...]``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from paths import FIXTURES

ROOT = FIXTURES / "original_checkpoints"
DESIGNS = tuple(sorted(p.name for p in ROOT.iterdir() if (p / "step1").is_dir()))
# The departure an import records for depth-width muP runs: their per-group training
# rules are not fields, so depthbench's step is not the original's (the logits are).
NOT_STEPPED = ("completep_width",)


def step_dir(design: str) -> Path:
    return ROOT / design / "step1"


def tokens(design: str) -> np.ndarray:
    return np.load(ROOT / design / "tok.npy").astype(np.int32)


def reference_logits(design: str) -> np.ndarray:
    return np.load(ROOT / design / "ref.npy")


def relative(ours, ref) -> float:
    """``max |ours - ref| / max |ref|``."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def cross_entropy(logits_btv: np.ndarray, tok_bt: np.ndarray) -> float:
    """Mean next-token cross entropy of ``logits[:, :-1]`` against ``tok[:, 1:]`` (fp64)."""
    z = logits_btv[:, :-1].astype(np.float64)
    top = z.max(-1, keepdims=True)
    lse = np.log(np.exp(z - top).sum(-1)) + top[..., 0]
    return float(np.mean(lse - np.take_along_axis(z, tok_bt[:, 1:, None], -1)[..., 0]))


def import_run(design: str, out: Path, **kwargs) -> Path:
    from depthbench.formats.olmo.step_dir import import_olmo

    import_olmo(step_dir(design), out, progress=False, **kwargs)
    return out


@dataclasses.dataclass(frozen=True)
class OriginalStep:
    """The original's one AdamW step, in the checkpoint's names."""

    before: dict[str, np.ndarray]  # p0
    grad: dict[str, np.ndarray]  # g
    lr: float  # the base group's (the embedding's)
    eps: float
    betas: tuple[float, float]


def original_step(design: str) -> OriginalStep:
    from depthbench.formats.olmo.distcp import DistCheckpoint

    ckpt = DistCheckpoint(step_dir(design) / "model_and_optim")
    groups = {}
    for g in sorted({k.split(".")[2] for k in ckpt.entries if k.startswith("optim.param_groups.")}):
        hp = {f: ckpt.entry(f"optim.param_groups.{g}.{f}")
              for f in ("lr", "weight_decay", "eps", "betas")}
        groups.update({name: hp for name in ckpt.entry(f"optim.param_groups.{g}.params")})
    before, grad = {}, {}
    for key in ckpt.tensors:
        p1 = np.asarray(ckpt.read(key), np.float64)
        if key not in groups:  # an alias of a trained tensor (HC's branch modules)
            before[key], grad[key] = p1.astype(np.float32), np.zeros(p1.shape, np.float32)
            continue
        hp = groups[key]
        g = np.asarray(ckpt.entry(f"optim.state.{key}.exp_avg"), np.float64) / (1 - hp["betas"][0])
        p0 = (p1 + hp["lr"] * g / (np.abs(g) + hp["eps"])) / (1 - hp["lr"] * hp["weight_decay"])
        before[key], grad[key] = p0.astype(np.float32), g.astype(np.float32)
    base = groups["embeddings.weight"]
    return OriginalStep(before, grad, float(base["lr"]), float(base["eps"]),
                        tuple(float(b) for b in base["betas"]))


def _tree(design: str, run, values: dict[str, np.ndarray]):
    """Checkpoint-named tensors as depthbench's parameter tree (the import's mapping;
    its constants, such as keel's unused block-0 norm, at their values)."""
    from depthbench.formats.olmo.step_dir import param_shapes
    from depthbench.formats.olmo.weights import convert

    present = {k: v.shape for k, v in values.items()}
    return convert(values.get, present, run.family, param_shapes(run.model), block=design)


def _constants_of(run, tree):
    """``tree`` with the import's constant entries set to the constants' values (where
    the original has no parameter, so no gradient)."""
    import jax

    from depthbench.formats.olmo.weights import tensors

    out = jax.tree.map(np.array, tree)
    for c in tensors(run.family)[1]:
        leaf = out
        for name in c.leaf.split("/"):
            leaf = leaf[name]
        leaf[c.index] = c.value
    return out


def step_against_the_original(design: str, run) -> dict[str, float]:
    """``{"grad": relative gradient difference, "loss_before": depthbench's loss at p0,
    "loss_after": depthbench's loss after its step, "ref_after": the original's}``."""
    import jax
    import jax.numpy as jnp

    from depthbench import parallel
    from depthbench.train import state as state_lib
    from depthbench.train import step as step_lib

    orig = original_step(design)
    tok = tokens(design)
    config = run.config.copy_and_resolve_references()
    config.train.update(lr=orig.lr, eps=orig.eps, b1=orig.betas[0], b2=orig.betas[1],
                        warmup_fraction=0.0, final_lr_fraction=1.0, clip_norm=1e9, steps=10,
                        seq_len=tok.shape[1] - 1, batch_size=tok.shape[0])
    s = state_lib.setup(config, parallel.mesh_from_config(config))
    params = jax.device_put(_tree(design, run, orig.before), s.param_shardings)
    batch = {"inputs": jnp.asarray(tok[:, :-1]), "targets": jnp.asarray(tok[:, 1:])}
    # One program gives the loss and gradient at the original's pre-step weights and,
    # called again, depthbench's loss after its step (the train loss, at the same key).
    grads_and_loss = jax.jit(lambda p: step_lib.grads_and_loss(s, p, batch, jax.random.key(0)))
    with s.context():
        loss, grads = grads_and_loss(params)
        opt_state = jax.jit(s.tx.init, out_shardings=s.state_shardings.opt_state)(params)
    theirs = jax.tree.leaves(_tree(design, run, orig.grad))
    ours = jax.tree.leaves(_constants_of(run, jax.device_get(grads)))
    scale = max(float(np.max(np.abs(t))) for t in theirs)
    grad = max(float(np.max(np.abs(np.asarray(o, np.float64) - t))) for o, t in
               zip(ours, theirs, strict=True)) / scale
    state = state_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                 opt_state=opt_state, rng=state_lib._key_data(0))
    new, _ = step_lib.make_train_step(s)(state, batch)
    with s.context():
        after = float(grads_and_loss(new.params)[0])
    return {"grad": grad, "loss_before": float(loss), "loss_after": after,
            "ref_after": cross_entropy(reference_logits(design), tok)}


def main(argv: list[str]) -> int:
    import sys
    import tempfile

    from depthbench import load_run

    print(f"{'design':16} {'family':12} {'logits':>8} {'gradient':>9} {'loss after step':>16}"
          f" {'original':>9}")
    for design in argv or DESIGNS:
        with tempfile.TemporaryDirectory() as tmp:
            run = load_run(import_run(design, Path(tmp) / "run"))
            err = relative(run.logits(tokens(design)), reference_logits(design))
            cols = ["(departure)", "", ""]
            if design not in NOT_STEPPED:
                step = step_against_the_original(design, run)
                cols = [f"{step['grad']:.1e}", f"{step['loss_after']:.6f}",
                        f"{step['ref_after']:.6f}"]
        print(f"{design:16} {run.spec.family:12} {err:8.1e} {cols[0]:>9} {cols[1]:>16} "
              f"{cols[2]:>9}", flush=True)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
