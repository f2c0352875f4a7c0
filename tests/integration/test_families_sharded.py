"""The residual-protocol contract on a mesh, for every family in the registry: a
(data 2, fsdp 2, tensor 2) mesh with the project's logical rules computes what
one device does.  All families run in one subprocess with a fake 8-device CPU
mesh (the single-device contract: tests/unit/test_families_shared.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from fast_xla import subprocess_flags
from jobs import communicate_or_fail

from depthbench.model.residual.protocol import registry
from depthbench.shapes import Shape, rule_d_ff

TINY = Shape(depth=3, d_model=32, d_ff=rule_d_ff(32), n_heads=4, n_kv_heads=4, vocab_size=64)
FAMILIES = registry.names()

_SHARDED_SCRIPT = r"""
import json, sys
import jax, numpy as np
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec
from depthbench import parallel
from depthbench.model.residual.protocol import registry
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer
from depthbench.shapes import Shape

assert jax.device_count() == 8, jax.devices()
shape = Shape(*json.loads(sys.argv[1]))
mesh = parallel.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
tokens = jax.random.randint(jax.random.key(3), (4, 8), 0, shape.vocab_size)
for name in registry.names():
    try:
        model = Transformer(ModelSpec.from_shape(shape, family=name))
        boxed = jax.jit(model.init)(jax.random.key(0), tokens)["params"]
        params = nn.unbox(boxed)
        fwd = lambda p, t: model.apply({"params": p}, t)[0]
        single = np.asarray(jax.jit(fwd)(params, tokens))
        p_sh = parallel.param_shardings(boxed, mesh)
        t_sh = parallel.batch_sharding(mesh)
        o_sh = NamedSharding(mesh, PartitionSpec(parallel.BATCH_AXES, None, "tensor"))
        with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.axis_rules()):
            run = jax.jit(fwd, in_shardings=(p_sh, t_sh), out_shardings=o_sh)
            out = run(jax.device_put(params, p_sh), jax.device_put(tokens, t_sh))
        res = {"family": name, "max_abs_diff": float(np.max(np.abs(np.asarray(out) - single))),
               "sharded_leaves": sum(not s.is_fully_replicated for s in jax.tree.leaves(p_sh)),
               "out_devices": len(out.sharding.device_set)}
    except Exception as e:  # reported per family by the test
        res = {"family": name, "error": f"{type(e).__name__}: {e}"[:2000]}
    print(json.dumps(res), flush=True)
"""


def _start_sharded_job() -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=subprocess_flags(8))
    shape = [TINY.depth, TINY.d_model, TINY.d_ff, TINY.n_heads, TINY.n_kv_heads,
             TINY.vocab_size]
    # stderr goes to a file: a full pipe would stall the job until the test reads it.
    errors = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-c", _SHARDED_SCRIPT, json.dumps(shape)],
                            stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
    proc.errors = errors
    return proc


def test_sharded_matches_single_device():
    """(data 2, fsdp 2, tensor 2) mesh with the project's logical rules == one device."""
    proc = _start_sharded_job()
    start = time.monotonic()
    stdout, _ = communicate_or_fail(proc, 600, "sharded subprocess")
    proc.errors.seek(0)
    assert proc.returncode == 0, proc.errors.read()[-3000:]
    results = {r["family"]: r for r in map(json.loads, (
        line for line in stdout.splitlines() if line.startswith('{"family"')))}
    assert sorted(results) == sorted(FAMILIES)
    bad = {}
    for name, r in results.items():
        if "error" in r:
            bad[name] = r["error"]
        elif not (r["max_abs_diff"] < 1e-5 and r["sharded_leaves"] > 0 and r["out_devices"] == 8):
            bad[name] = r
    assert not bad, bad
    print(f"sharded check waited {time.monotonic() - start:.1f}s")
