"""Prefill plus decode steps against the model's full forward: the decode tests' check.

:func:`decoded_and_full` runs, in one compiled program, the model's full
forward over ``tokens_bt`` and the decoder (``depthbench.model.decode``) over
the same tokens: each row's first ``lengths_b[b]`` tokens prefilled into a
cache, then ``steps`` decode steps, each fed the row's next token (teacher
forcing, so both see the same inputs).  The decoder's logits after each row's
last prompt token and after each step must equal the forward's at those
positions.  :func:`model_specs` lists every registered family and every
named variant that changes the model (a variant that only changes training,
``lr_rule`` or a weight-decay set, has its family's model), one spec each.

Run as a script (``python tests/helpers/decode_checks.py``, with
``--xla_force_host_platform_device_count=2``) it checks every spec on a
2-device mesh and prints one JSON line per spec (tests/integration/test_decode_families.py).
"""

from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from noisy_params import perturbed

from depthbench.model import decode
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer, params_init
from depthbench.shapes import Shape

# GQA (2 kv heads for 4 query heads); depth 5: attnres_block has blocks of 2
# sublayers (size and count partitions differ); the scan compiles one block anyway.
SHAPE = Shape(depth=5, d_model=32, d_ff=64, n_heads=4, n_kv_heads=2, vocab_size=64)
TOKENS = np.random.default_rng(0).integers(0, SHAPE.vocab_size, (2, 10)).astype(np.int32)
LENGTHS = np.array([3, 6], np.int32)  # per-row prompt lengths (right-padded to PROMPT)
PROMPT, STEPS, SIZE = 8, 4, 16  # prompt width, decode steps, cache slots


def relative(ours, ref) -> float:
    """``max |ours - ref| / max |ref|``."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


_INITS: dict[tuple, dict] = {}
_INIT_FNS: dict[tuple, object] = {}


def _params_init(model: Transformer, tokens_bt):
    """The spec's jitted ``transformer.params_init``: its shapes and its init share one trace."""
    key = (model.spec, tokens_bt.shape[1])
    if key not in _INIT_FNS:
        _INIT_FNS[key] = params_init(model, tokens_bt.shape[1])
    return _INIT_FNS[key]


def boxed_shapes(model: Transformer, tokens_bt=TOKENS):
    """``model.init``'s parameters as boxed shapes (``jax.eval_shape``: a trace of
    the whole model, which jax keeps for the spec's jitted init)."""
    return jax.eval_shape(_params_init(model, tokens_bt), jax.random.key(0))


def noisy_init(model: Transformer, tokens_bt=TOKENS):
    """``model``'s initial parameters moved off their init (numpy noise, nothing
    compiled but the init): the family's by ``0.3 N(0, 1)`` (at init its queries
    and projections are zero: a mix that could not tell a wrong slot), every
    parameter by ``0.1 N(0, 1)``.  Near the init the model stays well
    conditioned (fresh random stream mixes would amplify rounding ~100x over
    ten sublayers, and the forward would not agree with itself to 1e-5).  One
    compiled init per family and parameter shapes: its variants reuse it."""
    boxed = boxed_shapes(model, tokens_bt)
    key = (model.spec.family, str(jax.tree.structure(boxed)),
           tuple((a.shape, str(a.dtype)) for a in jax.tree.leaves(nn.unbox(boxed))))
    if key not in _INITS:
        _INITS[key] = nn.unbox(_params_init(model, tokens_bt)(jax.random.key(1)))
    return perturbed(perturbed(_INITS[key], 2, 0.3, only="residual"), 3, 0.1)


def decoded_and_full(model: Transformer, params, tokens_bt, lengths_b=LENGTHS,
                     prompt: int = PROMPT, steps: int = STEPS, size: int = SIZE):
    """``(decoded [steps + 1, B, V], forward [steps + 1, B, V], the final cache)``
    from one jitted call (see the module docstring); jit it under a mesh to run
    it sharded."""
    def run(params, tokens_bt):
        full_btv = model.apply({"params": params}, tokens_bt)[0]
        lengths = jnp.asarray(lengths_b, jnp.int32)
        prompt_bp = jnp.where(jnp.arange(prompt)[None] < lengths[:, None], tokens_bt[:, :prompt],
                              0)  # the padding is a real token id: it must not leak
        first_bv, cache = decode.prefill(model, params, prompt_bp, lengths, size)

        def step(cache, _):
            fed_b1 = jnp.take_along_axis(tokens_bt, cache.lengths_b[:, None], axis=1)
            logits_bv, cache = decode.decode_step(model, params, cache, fed_b1)
            return cache, logits_bv

        cache, steps_nbv = jax.lax.scan(step, cache, None, length=steps)
        at_nb = lengths[None, :] - 1 + jnp.arange(steps + 1)[:, None]
        want_nbv = jnp.take_along_axis(full_btv, at_nb.T[:, :, None], axis=1).transpose(1, 0, 2)
        return jnp.concatenate([first_bv[None], steps_nbv]), want_nbv, cache

    return run(params, tokens_bt)


def model_specs(shape: Shape = SHAPE) -> list[tuple[list[str], ModelSpec]]:
    """``(labels, spec)`` for every registered family and named variant, one per
    distinct model: a variant's ``model.residual`` fields on the family's spec
    (its other overrides change training only)."""
    from depthbench import variants
    from depthbench.model.residual.protocol import registry

    found: dict[ModelSpec, list[str]] = {}
    for family in registry.names():
        base = ModelSpec.from_shape(shape, family=family)
        found.setdefault(base, []).append(family)
        for name, overrides in variants.variants_of(family).items():
            fields = {k.removeprefix("model.residual."): v for k, v in overrides.items()
                      if k.startswith("model.residual.")}
            assert all(k.startswith(("model.residual.", "train.")) for k in overrides), overrides
            found.setdefault(base.with_fields(**fields), []).append(f"{family}+{name}")
    return [(labels, spec) for spec, labels in found.items()]


# Where a family has Pallas kernels (model.impl = "pallas"), in the forms they
# compute: the depth-attention kernel (attnres_full runs the same one, on blocks
# of one), hc's and mhc's routing kernels and the stream post-mix they share, and
# moda's joint-softmax kernel (its prefill; a decode step's cached keys stay in XLA).
PALLAS = {"attnres_block": {"attnres_blocks": 2}, "hc": {"hc_n": 2},
          "mhc": {"hc_n": 2, "sinkhorn_iters": 4}, "moda": {}}


def pallas_specs(shape: Shape = SHAPE) -> list[tuple[list[str], ModelSpec]]:
    """The :data:`PALLAS` forms with ``model.impl = "pallas"`` (interpreted on CPU)."""
    specs = {label: spec for labels, spec in model_specs(shape) for label in labels}
    return [([f"{label}@pallas"], specs[label].with_fields(**fields).replace(impl="pallas"))
            for label, fields in PALLAS.items()]


def _check_on_mesh(labels, spec, mesh_axes: dict[str, int]) -> dict:
    from jax.sharding import NamedSharding, PartitionSpec

    from depthbench import parallel

    t0 = time.perf_counter()
    model = Transformer(spec)
    params = noisy_init(model)
    mesh = parallel.make_mesh(mesh_axes)
    boxed = boxed_shapes(model)
    with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.axis_rules()):
        p_sh = parallel.param_shardings(boxed, mesh)
        tokens = jax.device_put(TOKENS, NamedSharding(mesh, PartitionSpec(parallel.BATCH_AXES)))
        got, want, cache = jax.jit(lambda p, t: decoded_and_full(model, p, t))(
            jax.device_put(params, p_sh), tokens)
    spec_k = cache.k_lbksh.sharding.spec
    return {"labels": labels, "mesh": mesh_axes, "relative": relative(got, want),
            "std": float(np.std(np.asarray(want))), "cache_spec": [str(a) for a in spec_k],
            "seconds": round(time.perf_counter() - t0, 1)}


# The original's own checkpoints imported with import-olmo (tests/fixtures/original_checkpoints):
# MoDA post-norm, 3 heads (the joint softmax with cached keys at another shape).
IMPORTED = ("moda_post",)


def decoded_run(run, tokens_bt: np.ndarray, lengths_b: np.ndarray, steps: int):
    """An imported (or trained) run through the generation layer's :class:`Decoder`
    (its mesh, its shardings, its buckets), teacher-forced: ``(decoded, forward)``
    logits ``[steps + 1, B, V]``, the forward the run's own (``Run.logits``)."""
    from depthbench.generation.decoder import Decoder

    decoder = Decoder(run)
    full = run.logits(tokens_bt)
    prompts = [row[:n].tolist() for row, n in zip(tokens_bt, lengths_b, strict=True)]
    rows = decoder.start(prompts, int(max(lengths_b)) + steps)
    got, want = [np.asarray(rows.logits_bv)], [full[np.arange(len(prompts)), lengths_b - 1]]
    for i in range(steps):
        rows = decoder.advance(rows, tokens_bt[np.arange(len(prompts)), lengths_b + i])
        got.append(np.asarray(rows.logits_bv))
        want.append(full[np.arange(len(prompts)), lengths_b + i])
    return np.stack(got)[:, :len(prompts)], np.stack(want)


def _check_imported(design: str, root) -> dict:
    import original_outputs

    from depthbench.run import load_run

    t0 = time.perf_counter()
    run = load_run(original_outputs.import_run(design, root / design))
    tokens = original_outputs.tokens(design)
    got, want = decoded_run(run, tokens, np.array([9, 12]), tokens.shape[1] - 13)
    return {"labels": [f"import-olmo:{design}"], "relative": relative(got, want),
            "std": float(np.std(want)),
            "devices": int(run.mesh.size), "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    """Every spec on a 2-device mesh, alternately batch-sharded (data 2) and
    kv-head-sharded (tensor 2), then the Pallas forms, then imported runs on
    their own mesh (both devices); one JSON line each."""
    import tempfile
    from pathlib import Path

    assert jax.device_count() == 2, jax.devices()
    meshes = ({"data": 2, "fsdp": 1, "tensor": 1}, {"data": 1, "fsdp": 1, "tensor": 2})
    checks = [lambda i=i, labels=labels, spec=spec: _check_on_mesh(labels, spec, meshes[i % 2])
              for i, (labels, spec) in enumerate(model_specs() + pallas_specs())]
    with tempfile.TemporaryDirectory() as root:
        checks += [lambda d=d: _check_imported(d, Path(root)) for d in IMPORTED]
        for check in checks:
            try:
                result = check()
            except Exception as e:  # reported per check by the test
                result = {"labels": ["?"], "error": f"{type(e).__name__}: {e}"[:2000]}
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
