"""The sharded train step equals one device.

The check runs this file as a script in a subprocess with a fake 8-device CPU
mesh (``XLA_FLAGS=--xla_force_host_platform_device_count=8``): one process
trains the same tiny model for two steps on one device and on the meshes
(data=8), (fsdp=4, tensor=2), (data=2, fsdp=2, tensor=2), and on the last mesh
with gradient accumulation (2 micro-batches), and reports the differences.
Mesh, logical rules and shardings themselves: tests/unit/test_parallel.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
from fast_xla import subprocess_flags
from jobs import communicate_or_fail
from paths import pythonpath_with_tests

from depthbench import parallel

MESHES = [(1, 1, 1), (8, 1, 1), (1, 4, 2), (2, 2, 2)]


def _sharded_main() -> None:
    """Runs in the 8-device subprocess: prints one JSON line per (mesh, micro)."""
    from depthbench import config as config_lib
    from depthbench.train import state as state_lib
    from depthbench.train import step as step_lib

    assert len(jax.devices()) == 8, jax.devices()
    config = config_lib.load(config_lib.base_spec_path(), [
        "model.suite=", "model.d_model=32", "model.d_ff=64", "model.depth=2", "model.n_heads=4",
        "model.vocab_size=64", "model.remat_policy=none", "train.seq_len=8",
        "train.batch_size=8", "train.steps=10", "train.lr=1e-3", "train.warmup_fraction=0"])
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(2):
        toks = rng.integers(0, 64, (8, 9)).astype(np.int32)
        batches.append({"inputs": toks[:, :-1], "targets": toks[:, 1:]})
    reference = None
    first = None
    for shape in MESHES:
        for micro in (1, 2):
            if micro == 2 and shape != (2, 2, 2):
                continue
            mesh = parallel.make_mesh(dict(zip(parallel.AXES, shape, strict=True)),
                                      jax.devices()[:int(np.prod(shape))])
            s = state_lib.setup(config, mesh)
            if first is None:
                first = jax.tree.map(np.asarray, state_lib.init_state(s, 0))
            # One initialisation, laid out on each mesh (init itself is tested elsewhere).
            st = jax.device_put(first, s.state_shardings)
            train = step_lib.make_train_step(s, micro)
            losses = []
            for b in batches:
                st, m = train(st, parallel.host_batch_to_global(b, mesh))
                losses.append(float(m["loss"]))
            params = jax.tree.map(np.asarray, st.params)
            sharded = sum(not x.sharding.is_fully_replicated for x in jax.tree.leaves(st.params))
            if reference is None:
                reference = (losses, params)
            diff = max(float(np.max(np.abs(a - b))) for a, b in
                       zip(jax.tree.leaves(reference[1]), jax.tree.leaves(params), strict=True))
            print(json.dumps({"mesh": shape, "micro": micro, "losses": losses,
                              "loss_diff": max(abs(a - b) for a, b in
                                               zip(losses, reference[0], strict=True)),
                              "param_diff": diff, "sharded_leaves": sharded}), flush=True)


def test_sharded_step_matches_single_device():
    env = {**os.environ, "XLA_FLAGS": subprocess_flags(8), "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": pythonpath_with_tests()}
    job = subprocess.Popen([sys.executable, __file__], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    out, err = communicate_or_fail(job, 300, "sharded subprocess")
    assert job.returncode == 0, err[-3000:]
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(rows) == 5, out
    for r in rows:
        print(f"mesh {tuple(r['mesh'])} micro {r['micro']}: loss diff {r['loss_diff']:.2e}, "
              f"max param diff {r['param_diff']:.2e}, sharded leaves {r['sharded_leaves']}")
        # fp32 reductions in another order: ~1e-6; two Adam steps at lr 1e-3 keep
        # parameter differences far below one step (1e-3).
        assert r["loss_diff"] < 1e-5, r
        assert r["param_diff"] < 2e-5, r
        if tuple(r["mesh"]) in ((1, 4, 2), (2, 2, 2)):
            assert r["sharded_leaves"] > 0, r  # the test would be vacuous otherwise
    # Training did something: the second loss differs from the first.
    assert rows[0]["losses"][0] != rows[0]["losses"][1]


if __name__ == "__main__":
    _sharded_main()
