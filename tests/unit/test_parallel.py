"""Mesh, logical rules and shardings (that the sharded train step equals one
device is checked in a subprocess: tests/integration/test_parallel_sharded.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import linen as nn
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

from depthbench import parallel
from depthbench.config import ConfigError
from depthbench.model.residual.protocol import registry
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer
from depthbench.shapes import Shape


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
        jax.eval_shape(lambda p, t, m=model: m.apply({"params": nn.unbox(p)}, t)[0], boxed,
                       tokens)
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


# ------------------------------------------------------ multi-process sweeps


def test_sweep_lead_process_from_the_launch_environment(monkeypatch):
    """Before JAX is initialised, a multi-process sweep knows process 0 from JAX_PROCESS_ID
    (local_multiprocess.sh) or SLURM_PROCID: only it writes sweep.json and results.csv."""
    from depthbench.sweep import execute

    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1234")
    for index, lead in (("0", True), ("1", False)):
        monkeypatch.setenv("JAX_PROCESS_ID", index)
        assert execute._lead_process(after_run=False) is lead
