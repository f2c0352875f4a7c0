"""``model.impl``: route attnres / hc / mhc / moda through the Pallas kernels or XLA.

* ``xla``: the families' own ``jnp`` maths (the reference);
* ``pallas``: the fused kernels of ``pallas_kernels`` (compiled on TPU/GPU,
  the Pallas interpreter on CPU: slow, for tests);
* ``auto``: ``pallas`` on a single TPU or GPU device when the kernel takes
  the shape, ``xla`` otherwise (CPU, or a multi-device mesh: the kernels
  partition over the batch, below, but have not yet been timed sharded on
  an accelerator, so ``auto`` does not choose them there).

Under a mesh each kernel runs per batch shard (``pallas_kernels.partition``):
the batch dimension goes over the mesh axes the logical name
``activation_batch`` maps to in the active rules (``data`` and ``fsdp``),
so no device gathers another's activations around a kernel.

The families call the functions below one for one in place of their XLA
expressions; each computes the same value (tests: ``test_kernels_model``,
sharded: ``test_kernels_partition``).
"""

from __future__ import annotations

import jax
from flax import linen as nn

IMPLS = ("xla", "pallas", "auto")


def use_pallas(spec) -> bool:
    """Whether this model's routing runs in the Pallas kernels."""
    impl = getattr(spec, "impl", "xla")
    if impl == "pallas":
        return True
    if impl != "auto":
        return False
    if jax.default_backend() not in ("tpu", "gpu", "cuda") or jax.device_count() != 1:
        return False
    # Mosaic takes any width whole; the GPU kernels keep [tile, d] tiles in
    # registers, which wide models outgrow.
    return jax.default_backend() == "tpu" or spec.d_model <= 4096


def batch_axes() -> tuple[str, ...]:
    """The mesh axes the batch dimension is split over under the active logical
    rules (none outside a rules context)."""
    return _mesh_axes("activation_batch")


def _per_shard(kernel, args, in_dims, out_dims):
    from pallas_kernels.partition import over_batch

    return over_batch(kernel, args, in_dims, out_dims, batch_axes())


def depth_mix(bank_mbtd, valid_m, query_d, key_norm_d, eps):
    from pallas_kernels import depth_attention

    def kernel(bank, valid, query, key_norm):
        return depth_attention(bank, valid, query, key_norm, eps)

    return _per_shard(kernel, (bank_mbtd, valid_m, query_d, key_norm_d), (1, None, None, None), 0)


def hc_pre(p, sub: int, h_nbtd, use_tanh: bool):
    """``(x, P[s, B, T, t], beta[s, B, T])`` of connector ``sub`` (see ``hc_pre``)."""
    from pallas_kernels import hc_operands
    from pallas_kernels import hc_pre as fused_pre

    names = ("A0", "beta0", "W_a", "w_b", "s_a", "s_b")
    ops = hc_operands(*(p[k][sub] for k in names))

    def kernel(h, w, base, scale):
        return fused_pre(h, w, base, scale, use_tanh=use_tanh)

    return _per_shard(kernel, (h_nbtd, *ops), (1, None, None, None), (0, 1, 1))


def mhc_pre(p, sub: int, h_nbtd, iters: int, temperature: float, eps: float, *,
            sinkhorn: str, sinkhorn_eps: float, layout: str, use_tanh: bool):
    """``(x, P[s, B, T, t], post[t, B, T])`` of connector ``sub`` (see ``mhc_pre``;
    ``sinkhorn``, ``sinkhorn_eps``, ``layout``, ``use_tanh``: the mhc form)."""
    from pallas_kernels import mhc_operands
    from pallas_kernels import mhc_pre as fused_pre

    names = ("phi", "a_pre", "a_post", "a_res", "b_pre", "b_post", "B_res")
    ops = mhc_operands(*(p[k][sub] for k in names))
    form = {"sinkhorn": sinkhorn, "sinkhorn_eps": sinkhorn_eps, "layout": layout,
            "use_tanh": use_tanh}

    def kernel(h, phi, scale, bias):
        return fused_pre(h, phi, scale, bias, iters=iters, temperature=temperature, eps=eps,
                         **form)

    return _per_shard(kernel, (h_nbtd, *ops), (1, None, None, None), (0, 1, 1))


def stream_post(h_nbtd, p_sbtt, b_tbt, y_btd):
    """``H'[t] = sum_s P[s, t] H[s] + b[t] y`` in ``H``'s dtype."""
    from pallas_kernels import stream_post as fused_post

    return _per_shard(fused_post, (h_nbtd, p_sbtt, b_tbt, y_btd), (1, 1, 1, 0), 1)


def _mesh_axes(logical: str) -> tuple[str, ...]:
    """The mesh axes the logical axis ``logical`` maps to under the active rules."""
    axes = nn.logical_to_mesh_axes((logical,))[0]
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def head_axes() -> tuple[str, ...]:
    """The mesh axes attention heads are split over under the active rules, where
    query and key heads are split alike (``activation_heads``,
    ``activation_kv_heads``); none otherwise."""
    heads = _mesh_axes("activation_heads")
    return heads if heads == _mesh_axes("activation_kv_heads") else ()


def moda_attention(q_btnh, k_btkh, v_btkh, q_depth_btnh, groups):
    """moda's joint softmax (``parts/moda_attention.attention_with_depth`` without
    a decoder's past keys or packed rows' segments, which stay in XLA): the
    causal sequence keys and each group ``(k, v [B, T, g, m, d_h], valid [m])``
    of the token's own depth keys, in ``q``'s dtype.

    Per batch shard, and per head shard too where the rules split heads
    (:func:`head_axes`: ``tensor``) and the shards divide every head count:
    heads are independent, and contiguous shards keep query head ``i`` with
    its key head ``i // (N / K)``, so the kernel's operands stay split as
    XLA's attention keeps them (no gather around the kernel)."""
    from pallas_kernels import moda_attention as fused_attention
    from pallas_kernels.partition import batch_shards

    n_groups = len(groups)

    def kernel(q, k, v, qd, *depth):
        return fused_attention(q, k, v, qd, [depth[i::n_groups] for i in range(n_groups)])

    depth = [x for i in range(3) for x in (g[i] for g in groups)]  # keys, values, valid
    args = (q_btnh, k_btkh, v_btkh, q_depth_btnh, *depth)
    batch, heads = batch_axes(), head_axes()
    head_counts = [q_btnh.shape[2], k_btkh.shape[2], *(g[0].shape[2] for g in groups)]
    n_heads = batch_shards(heads)
    if n_heads == 1 or set(heads) & set(batch) or any(c % n_heads for c in head_counts):
        in_dims = (0, 0, 0, 0, *([0] * 2 * n_groups), *([None] * n_groups))
        return _per_shard(kernel, args, in_dims, 0)
    rows = batch if batch and q_btnh.shape[0] % batch_shards(batch) == 0 else None
    split = jax.sharding.PartitionSpec(rows, None, heads)  # dims 0 and 2: batch, heads
    specs = (split,) * (4 + 2 * n_groups) + (jax.sharding.PartitionSpec(),) * n_groups
    # check_vma=False: a pallas_call declares no varying axes (partition.py).
    return jax.shard_map(kernel, mesh=jax.sharding.get_abstract_mesh(), in_specs=specs,
                         out_specs=split, check_vma=False)(*args)
