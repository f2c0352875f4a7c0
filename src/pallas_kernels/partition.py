"""The kernels under a mesh: each device runs its own batch shard (``shard_map``).

A compiled Pallas kernel is a custom call, and XLA's partitioner has no rule
for it: under a sharded ``jit`` it replicates the call, gathering every
operand onto every device and computing the whole batch everywhere.  Every
kernel here maps each token to its own outputs, reading besides that token
only small replicated operands (queries, projections, masks), so splitting
the batch dimension is exact.  :func:`over_batch` says so to XLA: the call
runs inside ``shard_map`` with the batch dimension of each array split over
the mesh axes given, every other operand replicated.  The custom VJPs stay
inside the map; the sums over tokens of their parameter gradients become
per-shard partial sums, which the map's transpose all-reduces.

``check_vma=False``: a ``pallas_call`` declares no varying-axes type for its
outputs (jax 0.10 refuses a checked map without one), and the specs here are
exact by construction (outputs split like the inputs they come from).  jax
versions that predate ``jax.shard_map`` get ``jax.experimental.shard_map``
with the same meaning (``check_rep=False``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
from jax.sharding import PartitionSpec


def _shard_map(fn, mesh, in_specs, out_specs):
    if hasattr(jax, "shard_map"):
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=False)
    from jax.experimental.shard_map import shard_map  # jax < 0.7

    return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def batch_shards(axes: Sequence[str]) -> int:
    """How many ways the current mesh (``jax.set_mesh``) splits a batch over
    ``axes``; 1 without a mesh, or where one of ``axes`` is already manual
    (inside another ``shard_map``) or absent."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not axes:
        return 1
    if any(a not in mesh.axis_names or a in mesh.manual_axes for a in axes):
        return 1
    return math.prod(mesh.shape[a] for a in axes)


def _spec(dim: int | None, axes: tuple[str, ...]) -> PartitionSpec:
    return PartitionSpec() if dim is None else PartitionSpec(*([None] * dim), axes)


def over_batch(kernel: Callable, args: Sequence, in_dims: Sequence[int | None],
               out_dims, axes: Sequence[str]):
    """``kernel(*args)``, run per batch shard under the current mesh.

    ``in_dims[i]``: the batch dimension of ``args[i]`` (``None``: replicated);
    ``out_dims``: the same for the outputs, as a pytree shaped like them.
    Without a mesh, on one shard, or when the shards do not divide a batch
    dimension (a batch that XLA would replicate as well), it is a plain call.
    """
    axes = tuple(axes)
    shards = batch_shards(axes)
    sizes = [a.shape[d] for a, d in zip(args, in_dims, strict=True) if d is not None]
    if shards == 1 or not sizes or any(s % shards for s in sizes):
        return kernel(*args)
    in_specs = tuple(_spec(d, axes) for d in in_dims)
    out_specs = jax.tree.map(lambda d: _spec(d, axes), out_dims, is_leaf=lambda d: d is None)
    mesh = jax.sharding.get_abstract_mesh()
    return _shard_map(kernel, mesh, in_specs, out_specs)(*args)
