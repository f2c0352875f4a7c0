"""The Pallas kernels partition over the batch under a mesh (integration: a subprocess).

One subprocess with a fake 8-device CPU mesh
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``) trains, for hc,
mhc, attnres_full, attnres_block and moda, the same tiny model two steps with
``model.impl=xla`` and ``model.impl=pallas`` from one initialisation, on
the mesh data=8 or data=2 x fsdp=2 x tensor=2 (:data:`MESHES`), and reports:

* the losses and final parameters of both (they must agree as closely as
  the unsharded kernels do, tests/integration/test_kernels_model.py);
* the all-gathers of each compiled train step (``.lower().compile()
  .as_text()``): the pallas program may gather no activation (an array
  with the sequence axis) that the xla program does not (data=8: none at all);
* the same pallas step lowered for ``tpu`` (Mosaic) and ``cuda`` (Triton):
  every kernel call there is a custom call, which XLA's partitioner cannot
  split, so each must receive one device's share of the tokens, never the
  global batch.  With the partitioning switched off (``fused.batch_axes``
  returning no axes) the same lowering hands the Triton kernels all 192
  tokens, and Mosaic refuses to lower at all ("Mosaic kernels cannot be
  automatically partitioned"): what ``impl=pallas`` did on a TPU mesh before.

On CPU the kernels run in the Pallas interpreter, whose plain HLO XLA can
partition by itself; the lowering check is the one that sees the real
kernels as XLA does on an accelerator.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from fast_xla import subprocess_flags
from paths import pythonpath_with_tests

FAMILIES = {
    "hc": ["model.residual.hc_n=2"],
    # The default mhc, Liger's form (the PyTorch form runs the same kernels with other
    # static options: test_kernels_model.py).
    "mhc": ["model.residual.hc_n=2", "model.residual.sinkhorn_iters=4"],
    "attnres_full": [],
    "attnres_block": ["model.residual.attnres_blocks=2"],
    "moda": [],
}
# Each family on one of the two meshes (data=8: the batch split alone, nothing may be
# gathered; 2 x 2 x 2: fsdp and tensor too, and the kernels as they were before they
# partitioned): the partitioning is fused.py's one over_batch for every kernel, so
# each kernel on one mesh sees it, at half the compiles of both.
MESHES = {"hc": [(2, 2, 2)], "mhc": [(8, 1, 1)], "attnres_full": [(8, 1, 1)],
          "attnres_block": [(2, 2, 2)], "moda": [(8, 1, 1), (2, 2, 2)]}
PARTITIONED = (2, 2, 2)
BATCH, SEQ = 16, 12  # 192 tokens; no parameter has a dimension of 12 or >= 192
KERNEL_CALLS = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}
pytestmark = pytest.mark.slow  # minutes: 12 sharded train steps compiled on a 2-core CPU


def _config(family: str, impl: str):
    from depthbench import config as config_lib

    return config_lib.load(config_lib.base_spec_path(), [
        "model.suite=", "model.d_model=32", "model.d_ff=64", "model.depth=2", "model.n_heads=4",
        "model.vocab_size=64", "model.remat_policy=none", f"train.seq_len={SEQ}",
        f"train.batch_size={BATCH}", "train.steps=10", "train.lr=1e-3",
        "train.warmup_fraction=0", f"model.family={family}", f"model.impl={impl}",
        *FAMILIES[family]])


def gathered_shapes(hlo: str) -> list[str]:
    """Result shapes of every all-gather in compiled HLO text (layouts dropped)."""
    return [re.sub(r"\{.*", "", s) for s in re.findall(r"= (\S+) all-gather\(", hlo)]


def activation_gathers(shapes: list[str]) -> list[str]:
    """The gathered arrays that have a sequence axis (activations, not parameters)."""
    return [s for s in shapes if str(SEQ) in re.findall(r"\d+", s.split("[", 1)[-1])]


def kernel_call_dims(mlir: str, call: str) -> list[int]:
    """Every dimension of every operand and result of the kernel custom calls."""
    dims = []
    for line in mlir.splitlines():
        if f"@{call}" in line or f'"{call}"' in line:
            signature = line.rsplit(" : ", 1)[-1]
            for tensor in re.findall(r"tensor<([0-9x]+)x[a-z]", signature):
                dims += [int(d) for d in tensor.split("x")]
    return dims


def kernel_call_batches(mlir: str, call: str) -> list[int]:
    """The leading dimension of every operand and result of rank >= 4 of the kernel
    calls.  moda's kernel keeps batch, heads and tokens apart (``[B, N, T, d_h]``,
    depth caches ``[B, T, g, m, d_h]``), so no dimension is the token count: its
    share is the batch's (and the heads', split over ``tensor``)."""
    batches = []
    for line in mlir.splitlines():
        if f"@{call}" in line or f'"{call}"' in line:
            signature = line.rsplit(" : ", 1)[-1]
            for tensor in re.findall(r"tensor<([0-9x]+)x[a-z]", signature):
                dims = tensor.split("x")
                if len(dims) >= 4:
                    batches.append(int(dims[0]))
    return batches


def _lowered_text(setup, state, batch, platform: str) -> str:
    """The train step lowered for ``platform``, as MLIR text (``model.impl=pallas``
    resolves its backend from the default backend, which is told to be that
    platform while tracing; a new step, so no trace is reused)."""
    from unittest import mock

    import jax

    from depthbench.train import step as step_lib

    train = step_lib.make_train_step(setup, 1)
    kind = {"cuda": "gpu"}.get(platform, platform)
    with setup.context(), mock.patch.object(jax, "default_backend", lambda: kind):
        return train.jitted.trace(state, batch).lower(lowering_platforms=(platform,)).as_text()


def _kernel_calls(setup, state, batch, platform: str, family: str, prefix: str = "") -> dict:
    """``{prefix}{platform}_dims`` (and for moda ``{prefix}{platform}_batches``)
    of one lowering of the train step for ``platform``."""
    text = _lowered_text(setup, state, batch, platform)
    out = {f"{prefix}{platform}_dims": kernel_call_dims(text, KERNEL_CALLS[platform])}
    if family == "moda":
        out[f"{prefix}{platform}_batches"] = kernel_call_batches(text, KERNEL_CALLS[platform])
    return out


def _unpartitioned(setup, state, batch, family: str) -> dict:
    """The kernels as they were before they partitioned (``fused.batch_axes``
    and ``fused.head_axes`` giving no axes): Triton's calls get the global
    batch, Mosaic refuses."""
    from depthbench.model.residual.parts import fused

    real, fused.batch_axes = fused.batch_axes, lambda: ()
    real_heads, fused.head_axes = fused.head_axes, lambda: ()
    try:
        out = _kernel_calls(setup, state, batch, "cuda", family, prefix="unpartitioned_")
        try:
            _lowered_text(setup, state, batch, "tpu")
            out["unpartitioned_tpu_error"] = ""
        except NotImplementedError as err:
            out["unpartitioned_tpu_error"] = str(err)
        return out
    finally:
        fused.batch_axes, fused.head_axes = real, real_heads


def _main() -> None:
    """Runs in the 8-device subprocess: one JSON line per (family, mesh)."""
    import jax

    from depthbench import parallel
    from depthbench.train import state as state_lib
    from depthbench.train import step as step_lib

    assert len(jax.devices()) == 8, jax.devices()
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 64, (BATCH, SEQ + 1)).astype(np.int32) for _ in range(2)]
    for family in FAMILIES:
        first = None
        for shape in MESHES[family]:
            mesh = parallel.make_mesh(dict(zip(parallel.AXES, shape, strict=True)))
            batches = [parallel.host_batch_to_global(
                {"inputs": t[:, :-1], "targets": t[:, 1:]}, mesh) for t in tokens]
            row, params = {"family": family, "mesh": shape}, {}
            for impl in ("xla", "pallas"):
                s = state_lib.setup(_config(family, impl), mesh)
                if first is None:
                    first = jax.tree.map(np.asarray, state_lib.init_state(s, 0))
                state = jax.device_put(first, s.state_shardings)
                train = step_lib.make_train_step(s, 1)
                with s.context():
                    hlo = train.jitted.lower(state, batches[0]).compile().as_text()
                row[f"{impl}_gathers"] = gathered_shapes(hlo)
                if impl == "pallas":
                    for platform in KERNEL_CALLS:
                        row.update(_kernel_calls(s, state, batches[0], platform, family))
                    if shape == PARTITIONED:
                        row.update(_unpartitioned(s, state, batches[0], family))
                losses = []
                for b in batches:
                    state, metrics = train(state, b)
                    losses.append(float(metrics["loss"]))
                row[f"{impl}_losses"] = losses
                params[impl] = jax.tree.map(np.asarray, state.params)
            row["param_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(
                jax.tree.leaves(params["pallas"]), jax.tree.leaves(params["xla"]), strict=True))
            print(json.dumps(row), flush=True)


@pytest.fixture(scope="module")
def rows():
    env = {**os.environ, "XLA_FLAGS": subprocess_flags(8), "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": pythonpath_with_tests()}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(out) == sum(map(len, MESHES.values())), proc.stdout[-2000:]
    assert {(r["family"], tuple(r["mesh"])) for r in out} == {
        (f, m) for f, meshes in MESHES.items() for m in meshes}
    return out


def test_sharded_pallas_step_matches_xla(rows):
    for r in rows:
        loss_diff = max(abs(a - b) for a, b in zip(r["pallas_losses"], r["xla_losses"],
                                                   strict=True))
        print(f"{r['family']} mesh {tuple(r['mesh'])}: loss diff {loss_diff:.1e}, "
              f"param diff {r['param_diff']:.1e}")
        # The unsharded kernels' loss tolerance (test_kernels_model.py); two Adam
        # steps at lr 1e-3 move parameters by up to 2e-3 (test_parallel.py's bound).
        np.testing.assert_allclose(r["pallas_losses"], r["xla_losses"], rtol=1e-5, atol=1e-6)
        assert r["param_diff"] < 2e-5, r
        assert r["xla_losses"][1] != r["xla_losses"][0]  # it trained


def test_kernels_add_no_activation_gather(rows):
    for r in rows:
        extra = list(activation_gathers(r["pallas_gathers"]))
        for shape in activation_gathers(r["xla_gathers"]):
            if shape in extra:
                extra.remove(shape)
        assert not extra, (r["family"], r["mesh"], extra)
        if tuple(r["mesh"]) == (8, 1, 1):  # pure data parallelism: nothing to gather
            assert r["pallas_gathers"] == [], (r["family"], r["pallas_gathers"])


def test_real_kernels_receive_one_shard_of_tokens(rows):
    tokens = BATCH * SEQ
    for r in rows:
        if r["family"] == "moda":  # kernel_call_batches: a batch shard (4 or 8 of them)
            for platform in KERNEL_CALLS:
                assert max(r[f"{platform}_batches"]) <= BATCH // 4, (r["mesh"], platform)
            if "unpartitioned_cuda_batches" in r:
                assert max(r["unpartitioned_cuda_batches"]) == BATCH
                assert "cannot be automatically partitioned" in r["unpartitioned_tpu_error"]
            continue
        for platform in KERNEL_CALLS:
            dims = r[f"{platform}_dims"]
            assert dims, f"{r['family']}: no {platform} kernel call found"
            # A shard holds tokens / 4 (2 x 2 x 2) or / 8 (data 8), padded to a tile.
            assert max(dims) < tokens, (r["family"], r["mesh"], platform, max(dims))
        if "unpartitioned_cuda_dims" in r:  # the check can fail: the kernels before
            assert max(r["unpartitioned_cuda_dims"]) >= tokens, r["family"]
            assert "cannot be automatically partitioned" in r["unpartitioned_tpu_error"]


if __name__ == "__main__":
    _main()
