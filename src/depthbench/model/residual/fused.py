"""``model.impl``: route attnres / hc / mhc through the Pallas kernels or XLA.

* ``xla``: the families' own ``jnp`` maths (the reference);
* ``pallas``: the fused kernels of ``pallas_kernels`` (compiled on TPU/GPU,
  the Pallas interpreter on CPU: slow, for tests);
* ``auto``: ``pallas`` on a single TPU or GPU device when the kernel takes
  the shape, ``xla`` otherwise (CPU, or a multi-device mesh: the kernels
  have no partitioning rule yet, so under a sharded ``jit`` XLA would
  gather their operands onto every device).

The families call the functions below one for one in place of their XLA
expressions; each computes the same value (tests: ``test_kernels_model``).
"""

from __future__ import annotations

import jax

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


def depth_mix(bank_mbtd, valid_m, query_d, key_norm_d, eps):
    from pallas_kernels import depth_attention

    return depth_attention(bank_mbtd, valid_m, query_d, key_norm_d, eps)


def hc_pre(p, sub: int, h_nbtd, use_tanh: bool):
    """``(x, P[s, B, T, t], beta[s, B, T])`` of connector ``sub`` (see ``hc_pre``)."""
    from pallas_kernels import hc_operands
    from pallas_kernels import hc_pre as kernel

    names = ("A0", "beta0", "W_a", "w_b", "s_a", "s_b")
    return kernel(h_nbtd, *hc_operands(*(p[k][sub] for k in names)), use_tanh=use_tanh)


def mhc_pre(p, sub: int, h_nbtd, iters: int, temperature: float, eps: float):
    """``(x, P[s, B, T, t], post[t, B, T])`` of connector ``sub`` (see ``mhc_pre``)."""
    from pallas_kernels import mhc_operands
    from pallas_kernels import mhc_pre as kernel

    names = ("phi", "a_pre", "a_post", "a_res", "b_pre", "b_post", "B_res")
    ops = mhc_operands(*(p[k][sub] for k in names))
    return kernel(h_nbtd, *ops, iters=iters, temperature=temperature, eps=eps)


def stream_post(h_nbtd, p_sbtt, b_tbt, y_btd):
    """``H'[t] = sum_s P[s, t] H[s] + b[t] y`` in ``H``'s dtype."""
    from pallas_kernels import stream_post as kernel

    return kernel(h_nbtd, p_sbtt, b_tbt, y_btd)
