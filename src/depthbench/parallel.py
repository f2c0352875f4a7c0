"""Device mesh, logical axis rules and the shardings derived from them.

One ``('data', 'fsdp', 'tensor')`` mesh serves every run (docs/LAUNCH.md,
"Memory"); the model names every dimension logically and :func:`axis_rules`
maps those names to mesh axes, the one table every sharding derives from."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from depthbench.errors import ConfigError
from depthbench.model.residual.protocol import registry

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # mesh axes a batch dimension is split over

# Logical name -> mesh axis (or axes, or None = replicated) for the names the
# backbone uses.  Flax applies the rules in order and never uses one mesh axis
# twice in an array, so the order also says which dimension wins a contested
# axis.  Residual families declare the names they add (``sharding_rules`` in
# their own module); :func:`axis_rules` is the whole table.
BACKBONE_RULES: tuple[tuple[str, Any], ...] = (
    # parameters
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("embed", "fsdp"),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
    # activations
    ("activation_batch", BATCH_AXES),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv_heads", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
)


def axis_rules() -> tuple[tuple[str, Any], ...]:
    """The backbone's rules, then every registered family's declarations."""
    return BACKBONE_RULES + registry.sharding_rules()


def mesh_shape(sizes: Mapping[str, int], n_devices: int) -> tuple[int, int, int]:
    """Resolve ``{'data': -1, 'fsdp': 2, 'tensor': 1}`` against ``n_devices``: at most
    one axis -1 ("the rest"), the product equal to the device count; errors name
    the ``parallel.*`` field."""
    values = [int(sizes[a]) for a in AXES]
    free = [a for a, v in zip(AXES, values, strict=True) if v == -1]
    if len(free) > 1:
        raise ConfigError(f"config.parallel.{free[1]}: only one mesh axis may be -1 "
                          f"(got -1 for {', '.join(free)})")
    for a, v in zip(AXES, values, strict=True):
        if v != -1 and v < 1:
            raise ConfigError(f"config.parallel.{a}: must be a positive integer or -1, got {v}")
    fixed = math.prod(v for v in values if v != -1)
    if free:
        if n_devices % fixed:
            raise ConfigError(
                f"config.parallel.{free[0]}: the other axes use {fixed} devices, which does "
                f"not divide the {n_devices} available")
        values[AXES.index(free[0])] = n_devices // fixed
    elif fixed != n_devices:
        shape = " x ".join(f"{a}={v}" for a, v in zip(AXES, values, strict=True))
        raise ConfigError(f"config.parallel: mesh {shape} needs {fixed} devices, "
                          f"{n_devices} are available (set one axis to -1)")
    return tuple(values)


def make_mesh(sizes: Mapping[str, int], devices: Sequence[Any] | None = None) -> Mesh:
    """The mesh over ``devices`` (default: all), axis types Auto: the model
    constrains activations through logical names, XLA propagates the rest."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(sizes, len(devices))
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def mesh_from_config(config, devices: Sequence[Any] | None = None) -> Mesh:
    p = config.parallel
    return make_mesh({"data": p.data, "fsdp": p.fsdp, "tensor": p.tensor}, devices)


def describe(mesh: Mesh) -> dict:
    return {"shape": dict(mesh.shape), "devices": int(mesh.size),
            "device_kind": mesh.devices.flat[0].device_kind,
            "platform": mesh.devices.flat[0].platform, "processes": jax.process_count()}


def _axis_size(mesh: Mesh, axes: Any) -> int:
    if axes is None:
        return 1
    if isinstance(axes, str):
        axes = (axes,)
    return math.prod(mesh.shape[a] for a in axes)


def spec_for(names: Sequence[str | None] | None, shape: Sequence[int], mesh: Mesh,
             rules: Sequence[tuple[str, Any]] | None = None) -> PartitionSpec:
    """The PartitionSpec of an array with logical dimension ``names``; a dimension
    the mapped mesh axes do not divide is replicated (jit refuses uneven argument
    shardings), the others keep theirs."""
    if names is None:
        return PartitionSpec()
    if len(names) != len(shape):
        raise ValueError(f"logical names {tuple(names)} do not match shape {tuple(shape)}")
    mesh_axes = nn.logical_to_mesh_axes(tuple(names), list(rules or axis_rules()))
    fitted = [ax if dim % _axis_size(mesh, ax) == 0 else None
              for ax, dim in zip(mesh_axes, shape, strict=True)]
    return PartitionSpec(*fitted)


def _is_box(x: Any) -> bool:
    return isinstance(x, nn.Partitioned)


def logical_names(boxed_tree: Any) -> Any:
    """The logical names of a tree of boxed (``nn.LogicallyPartitioned``) leaves;
    ``None`` for leaves created without names (they are replicated)."""
    return jax.tree.map(lambda x: tuple(x.names) if _is_box(x) else None, boxed_tree,
                        is_leaf=_is_box)


def param_shardings(boxed_params: Any, mesh: Mesh,
                    rules: Sequence[tuple[str, Any]] | None = None) -> Any:
    """NamedShardings for an (abstract) boxed parameter tree, as an unboxed tree."""
    rules = rules or axis_rules()

    def one(x):
        names = tuple(x.names) if _is_box(x) else None
        value = x.value if _is_box(x) else x
        return NamedSharding(mesh, spec_for(names, value.shape, mesh, rules))

    return jax.tree.map(one, boxed_params, is_leaf=_is_box)


def shardings_like(tree: Any, reference: Any, reference_shardings: Any, mesh: Mesh) -> Any:
    """Shardings for ``tree`` (an optimizer state) from a reference tree: a leaf
    whose key path ends with a same-shaped reference leaf's path (Adam's
    ``mu['blocks']['mlp']['up']``) takes its sharding, every other leaf is
    replicated, whatever the optax state's structure."""
    ref = {}
    for (path, leaf), sh in zip(jax.tree_util.tree_flatten_with_path(reference)[0],
                                jax.tree.leaves(reference_shardings), strict=True):
        ref[tuple(path)] = (tuple(np.shape(leaf)), sh)
    replicated = NamedSharding(mesh, PartitionSpec())
    longest = max((len(p) for p in ref), default=0)

    def pick(path, leaf):
        path = tuple(path)
        for start in range(max(0, len(path) - longest), len(path)):
            hit = ref.get(path[start:])
            if hit is not None and hit[0] == tuple(np.shape(leaf)):
                return hit[1]
        return replicated

    return jax.tree_util.tree_map_with_path(pick, tree)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Batch dimension over ('data', 'fsdp'); the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_shards(mesh: Mesh) -> int:
    """How many ways a batch is split (data x fsdp)."""
    return _axis_size(mesh, BATCH_AXES)


def check_batch(mesh: Mesh, batch_size: int, microbatches: int) -> None:
    """Each micro-batch must split evenly over the batch axes and the hosts."""
    shards = batch_shards(mesh)
    per_micro = batch_size // microbatches
    if per_micro % shards:
        raise ConfigError(
            f"config.train.batch_size: {batch_size} sequences in {microbatches} micro-batch(es) "
            f"gives {per_micro} per micro-batch, not divisible by the {shards} batch shards "
            f"(parallel.data x parallel.fsdp)")
    if batch_size % jax.process_count():
        raise ConfigError(f"config.train.batch_size: {batch_size} is not divisible by the "
                          f"{jax.process_count()} hosts")


def host_batch_to_global(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assemble each host's rows of a batch into global arrays sharded over
    ('data', 'fsdp').  On one host this is a plain sharded device_put."""
    return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(v)),
                                                      np.asarray(v))
            for k, v in batch.items()}


def distributed_reason(environ: Mapping[str, str] | None = None) -> str | None:
    """Why this process looks like one of several (None on a single host): an
    explicit coordinator, SLURM with several tasks, a multi-host TPU slice or an
    Open MPI launch, the environments ``jax.distributed.initialize()`` detects."""
    env = os.environ if environ is None else environ
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return "JAX_COORDINATOR_ADDRESS is set"
    if env.get("SLURM_JOB_ID") and _env_count(env, "SLURM_NTASKS") > 1:
        return f"SLURM job with {env['SLURM_NTASKS']} tasks"
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    if len(hosts) > 1:
        return f"TPU slice with {len(hosts)} hosts"
    if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "multi-slice TPU (MEGASCALE_COORDINATOR_ADDRESS is set)"
    if _env_count(env, "OMPI_COMM_WORLD_SIZE") > 1:
        return f"Open MPI launch with {env['OMPI_COMM_WORLD_SIZE']} ranks"
    return None


def _env_count(env: Mapping[str, str], var: str) -> int:
    """A launcher's process count (unset or empty: 1), checked: one line naming
    the variable, not a ValueError from int()."""
    text = env.get(var, "").strip()
    if not text:
        return 1
    if not text.isdigit():
        raise ConfigError(f"{var}: expected a non-negative integer, got {text!r}")
    return int(text)


_initialized = False


def distributed_args(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``jax.distributed.initialize`` arguments from ``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (those set; JAX itself reads
    only the address, and detects the rest on SLURM, TPU slices and MPI)."""
    env = os.environ if environ is None else environ
    args: dict[str, Any] = {}
    if env.get("JAX_COORDINATOR_ADDRESS"):
        args["coordinator_address"] = env["JAX_COORDINATOR_ADDRESS"]
    for var, key in (("JAX_NUM_PROCESSES", "num_processes"), ("JAX_PROCESS_ID", "process_id")):
        value = env.get(var, "")
        if value:
            if not value.isdigit():
                raise ConfigError(f"{var}: expected a non-negative integer, got {value!r}")
            args[key] = int(value)
    n, i = args.get("num_processes"), args.get("process_id")
    if n is not None and i is not None and not (0 <= i < n and n >= 1):
        raise ConfigError(f"JAX_PROCESS_ID: {i} is not in [0, JAX_NUM_PROCESSES={n})")
    return args


def env_process_index(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's index as the launch environment states it, before JAX is
    initialised (``JAX_PROCESS_ID``, else ``SLURM_PROCID``); None if unstated."""
    env = os.environ if environ is None else environ
    for var in ("JAX_PROCESS_ID", "SLURM_PROCID"):
        if env.get(var, "").isdigit():
            return int(env[var])
    return None


def maybe_initialize_distributed(mode: str = "auto") -> bool:
    """Call ``jax.distributed.initialize()`` once if ``mode`` is "on", or "auto" in a
    multi-host environment; before any device is used.  Returns whether it ran.
    CPU collectives go through gloo (without it CPU processes cannot reduce
    across each other, as in the local multi-process rehearsal)."""
    global _initialized
    if mode not in ("auto", "on", "off"):
        raise ConfigError(f"config.parallel.distributed: {mode!r} is not one of auto, on, off")
    if _initialized or mode == "off" or (mode == "auto" and distributed_reason() is None):
        return _initialized
    args = distributed_args()
    # gloo unless the user chose another (mpi); JAX 0.10 defaults to it, older ones did not.
    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") in (None, "gloo"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**args)
    _initialized = True
    return True


def is_main_process() -> bool:
    """Whether this process writes the run's files (metrics, TensorBoard, result.json,
    results.csv): process 0.  Every process still joins collectives and checkpoints."""
    return jax.process_index() == 0


def sync_flag(flag: bool) -> bool:
    """True on every host if ``flag`` is true on any (a per-step agreement,
    so that all hosts stop at the same step boundary)."""
    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.array([flag], np.int32))))
