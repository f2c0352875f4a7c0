"""Decoding with a KV cache is exact for every family, every named variant, the
Pallas kernels and imported runs, on a 2-device mesh (issue 40, item 2).

One subprocess with a fake 2-device CPU mesh runs tests/helpers/decode_checks.py:
each distinct model (every registered family, every variant that changes the
model) compiles one program holding its full forward and the decoder (a
prefill of rows of 3 and 6 tokens, then 4 teacher-forced decode steps), on a
mesh that alternates between batch-sharded (data 2) and kv-head-sharded
(tensor 2) caches; then attnres_block, hc and mhc with ``model.impl=pallas``
(interpreted), and one of the original's own checkpoints imported with
import-olmo, decoded through ``generation.Decoder`` on the run's own mesh.
Each must give the forward's logits at every position within 1e-5 relative
(fp32).  Single-device cases, import-hf, padding and the cache's layout:
tests/unit/test_decode.py and tests/unit/test_hf_import.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from decode_checks import IMPORTED, model_specs, pallas_specs
from fast_xla import subprocess_flags
from jobs import communicate_or_fail
from paths import HELPERS, pythonpath_with_tests

from depthbench.model.residual.protocol import registry
from depthbench.variants import variants_of


def test_every_family_and_variant_decodes_exactly_on_a_mesh():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=subprocess_flags(2),
               PYTHONPATH=pythonpath_with_tests())
    errors = tempfile.TemporaryFile("w+")  # a full stderr pipe would stall the job
    proc = subprocess.Popen([sys.executable, str(HELPERS / "decode_checks.py")],
                            stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
    stdout, _ = communicate_or_fail(proc, 600, "decode subprocess")
    errors.seek(0)
    assert proc.returncode == 0, errors.read()[-3000:]
    results = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    failed = [r for r in results if "error" in r]
    assert not failed, failed

    by_label = {label: r for r in results for label in r["labels"]}
    every = {f"{family}+{v}" for family in registry.names() for v in variants_of(family)}
    assert set(registry.names()) | every <= set(by_label)
    assert {f"import-olmo:{d}" for d in IMPORTED} <= set(by_label)
    assert len(results) == len(model_specs()) + len(pallas_specs()) + len(IMPORTED)
    for r in results:
        assert r["relative"] < 1e-5, r
        assert r["std"] > 0.1, r  # logits far from uniform: a wrong key or position would show
        if "mesh" in r:  # the cache sharded as the mesh says: batch over data, kv heads over tensor
            axis = 1 if r["mesh"]["data"] == 2 else 2
            assert r["cache_spec"][axis] == ("data" if axis == 1 else "tensor"), r
        else:
            assert r["devices"] == 2, r
    worst = {}
    for r in results:
        family = r["labels"][0].split("+")[0].split("@")[0]
        worst[family] = max(worst.get(family, 0.0), r["relative"])
    print("largest relative error per family:",
          ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
