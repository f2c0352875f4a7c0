"""Mesh, logical rules and shardings; the sharded train step equals one device.

The equivalence check runs in a subprocess with a fake 8-device CPU mesh
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``): one process trains
the same tiny model for two steps on one device and on the meshes
(data=8), (fsdp=4, tensor=2), (data=2, fsdp=2, tensor=2), and on the
last mesh with gradient accumulation (2 micro-batches), and reports the
differences.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from fast_xla import subprocess_flags
from flax import linen as nn
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

from depthbench import parallel
from depthbench.config import ConfigError
from depthbench.model.residual import registry
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer
from depthbench.shapes import Shape

MESHES = [(1, 1, 1), (8, 1, 1), (1, 4, 2), (2, 2, 2)]


def _abstract(data, fsdp, tensor):
    return AbstractMesh((data, fsdp, tensor), parallel.AXES, axis_types=(AxisType.Auto,) * 3)


# ------------------------------------------------------------------ mesh shape


def test_mesh_shape_resolves_the_free_axis():
    assert parallel.mesh_shape({"data": -1, "fsdp": 1, "tensor": 1}, 8) == (8, 1, 1)
    assert parallel.mesh_shape({"data": 1, "fsdp": -1, "tensor": 2}, 8) == (1, 4, 2)
    assert parallel.mesh_shape({"data": 2, "fsdp": 2, "tensor": 2}, 8) == (2, 2, 2)
    assert parallel.mesh_shape({"data": -1, "fsdp": 1, "tensor": 1}, 1) == (1, 1, 1)


@pytest.mark.parametrize("sizes, field", [
    ({"data": -1, "fsdp": -1, "tensor": 1}, "parallel.fsdp"),
    ({"data": -1, "fsdp": 3, "tensor": 1}, "parallel.data"),
    ({"data": 2, "fsdp": 2, "tensor": 1}, "parallel"),
    ({"data": 0, "fsdp": 1, "tensor": 1}, "parallel.data"),
])
def test_mesh_shape_errors_name_the_field(sizes, field):
    with pytest.raises(ConfigError, match=rf"config\.{field}"):
        parallel.mesh_shape(sizes, 8)


def test_single_device_mesh_has_explicit_auto_axes():
    mesh = parallel.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
    assert mesh.axis_names == parallel.AXES
    assert tuple(mesh.axis_types) == (AxisType.Auto,) * 3
    assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}


# ---------------------------------------------------------------- rules table


def test_rules_map_params_for_fsdp_and_tensor_parallelism():
    mesh = _abstract(2, 2, 2)
    P = PartitionSpec
    assert parallel.spec_for(("embed", "mlp"), (32, 64), mesh) == P("fsdp", "tensor")
    assert parallel.spec_for(("mlp", "embed"), (64, 32), mesh) == P("tensor", "fsdp")
    assert parallel.spec_for(("vocab", "embed"), (64, 32), mesh) == P("tensor", "fsdp")
    assert parallel.spec_for(("embed", "heads", "head_dim"), (32, 4, 8), mesh) == P(
        "fsdp", "tensor", None)
    assert parallel.spec_for(("layers", "embed", "mlp"), (3, 32, 64), mesh) == P(
        None, "fsdp", "tensor")
    assert parallel.spec_for(("norm",), (32,), mesh) == P(None)
    assert parallel.spec_for(("layers", "streams", "routing"), (3, 4, 6), mesh) == P(
        None, None, None)
    assert parallel.spec_for(None, (3,), mesh) == P()
    assert parallel.spec_for(("activation_batch", "activation_length", "activation_vocab"),
                             (8, 16, 64), mesh) == P(("data", "fsdp"), None, "tensor")


def test_indivisible_dims_fall_back_to_replication_per_dim():
    mesh = _abstract(1, 4, 2)
    # 3 heads cannot split over tensor=2; the embed dim keeps its fsdp sharding.
    assert parallel.spec_for(("embed", "heads", "head_dim"), (32, 3, 8), mesh) == PartitionSpec(
        "fsdp", None, None)
    assert parallel.spec_for(("embed", "mlp"), (6, 64), mesh) == PartitionSpec(None, "tensor")
    # The batch axes (data x fsdp = 4) do not divide 6.
    assert parallel.spec_for(("activation_batch", None), (6, 5), mesh) == PartitionSpec(None, None)


def _tiny_spec(family: str) -> ModelSpec:
    return ModelSpec.from_shape(Shape(2, 32, 64, 4, 4, 64), family=family,
                                remat_policy="none")


def test_rules_cover_every_logical_name_of_every_family(monkeypatch):
    """Each parameter and activation name any registered family uses has a rule
    (an unknown name would silently stay replicated)."""
    seen: set[str] = set()
    real = nn.with_logical_constraint

    def recording(x, names, *a, **k):
        seen.update(n for n in jax.tree.leaves(names) if isinstance(n, str))
        return real(x, names, *a, **k)

    monkeypatch.setattr(nn, "with_logical_constraint", recording)
    tokens = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    param_names: set[str] = set()
    for family in registry.names():
        model = Transformer(_tiny_spec(family))
        boxed = jax.eval_shape(lambda k, m=model: m.init(k, tokens), jax.random.key(0))["params"]
        for names in jax.tree.leaves(parallel.logical_names(boxed),
                                     is_leaf=lambda x: isinstance(x, tuple)):
            param_names.update(n for n in names if n is not None)
        jax.eval_shape(lambda p, t, m=model: m.apply({"params": nn.unbox(p)}, t), boxed, tokens)
    ruled = {name for name, _ in parallel.axis_rules()}
    assert param_names, "no logical parameter names found"
    assert seen, "no activation constraints recorded"
    assert param_names <= ruled, sorted(param_names - ruled)
    assert seen <= ruled, sorted(seen - ruled)


def test_param_and_optimizer_state_shardings_follow_the_parameters():
    mesh = parallel.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    model = Transformer(_tiny_spec("pre_ln"))
    boxed = jax.eval_shape(lambda k: model.init(k, jnp.zeros((1, 8), jnp.int32)),
                           jax.random.key(0))["params"]
    p_sh = parallel.param_shardings(boxed, mesh)
    up = p_sh["blocks"]["mlp"]["up"]
    assert isinstance(up, NamedSharding) and up.spec == PartitionSpec(None, "fsdp", "tensor")
    params = nn.unbox(boxed)
    opt = jax.eval_shape(optax.adamw(1e-3).init, params)
    o_sh = parallel.shardings_like(opt, params, p_sh, mesh)
    adam = o_sh[0]
    assert adam.mu["blocks"]["mlp"]["up"].spec == up.spec
    assert adam.nu["embed"].spec == p_sh["embed"].spec == PartitionSpec("tensor", "fsdp")
    assert adam.count.spec == PartitionSpec()


def test_check_batch_names_the_field():
    with pytest.raises(ConfigError, match=r"config\.train\.batch_size"):
        parallel.check_batch(_abstract(2, 2, 2), batch_size=8, microbatches=4)
    parallel.check_batch(_abstract(2, 2, 2), batch_size=8, microbatches=2)


@pytest.mark.parametrize("env, expected", [
    ({}, False),
    ({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1"}, False),
    ({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}, True),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, False),
    ({"TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3"}, True),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, True),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, True),
])
def test_distributed_detection(env, expected):
    assert (parallel.distributed_reason(env) is not None) is expected


def test_distributed_args_pass_all_three_variables():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
           "JAX_PROCESS_ID": "3"}
    assert parallel.distributed_args(env) == {"coordinator_address": "10.0.0.1:1234",
                                              "num_processes": 4, "process_id": 3}
    assert parallel.distributed_args({"JAX_COORDINATOR_ADDRESS": "h:1"}) == {
        "coordinator_address": "h:1"}  # the rest left to JAX's cluster detection
    assert parallel.env_process_index(env) == 3
    assert parallel.env_process_index({"SLURM_PROCID": "0"}) == 0
    assert parallel.env_process_index({}) is None
    with pytest.raises(ConfigError, match="JAX_PROCESS_ID: 4 is not in"):
        parallel.distributed_args({**env, "JAX_PROCESS_ID": "4"})
    with pytest.raises(ConfigError, match="JAX_NUM_PROCESSES: expected a non-negative"):
        parallel.distributed_args({**env, "JAX_NUM_PROCESSES": "four"})


def test_distributed_off_never_initializes():
    assert parallel.maybe_initialize_distributed("off") is False
    with pytest.raises(ConfigError, match="parallel.distributed"):
        parallel.maybe_initialize_distributed("sometimes")


# ------------------------------------------------- sharded == single device


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


@pytest.fixture(scope="module", autouse=True)
def sharded_job(request):
    """Start the 8-device subprocess as this module starts (if its test is
    selected), so it compiles while the tests above run."""
    wanted = any(item.name == "test_sharded_step_matches_single_device"
                 for item in request.session.items)
    if not wanted:
        yield None
        return
    env = {**os.environ, "XLA_FLAGS": subprocess_flags(8),
           "JAX_PLATFORMS": "cpu"}
    job = subprocess.Popen([sys.executable, __file__], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    yield job
    if job.poll() is None:
        job.kill()


def test_sharded_step_matches_single_device(sharded_job):
    try:
        out, err = sharded_job.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        sharded_job.kill()
        pytest.fail("sharded subprocess timed out")
    assert sharded_job.returncode == 0, err[-3000:]
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


def test_sweep_lead_process_from_the_launch_environment(monkeypatch):
    """Before JAX is initialised, a multi-process sweep knows process 0 from JAX_PROCESS_ID
    (local_multiprocess.sh) or SLURM_PROCID: only it writes sweep.json and results.csv."""
    from depthbench.sweep import execute

    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1234")
    for index, lead in (("0", True), ("1", False)):
        monkeypatch.setenv("JAX_PROCESS_ID", index)
        assert execute._lead_process(after_run=False) is lead
