"""Fused Pallas kernels for depthbench's two memory-bound hot spots.

* :func:`depth_attention`: AttnRes depth attention (logits over the sources'
  RMS-normalised keys, fp32 softmax over the valid ones, weighted sum), one
  pass over the sources per token tile, backward through ``jax.custom_vjp``;
  :func:`completed_sources_attention` + :func:`merge_partial`: the two-phase
  Block AttnRes form for prefill.
* :func:`hc_pre`, :func:`mhc_pre`: HC / mHC coefficients (mHC's Sinkhorn in
  fp32, recomputed on chip in the backward) and the sublayer input;
  :func:`stream_post`: ``H'[t] = sum_s P[s, t] H[s] + b[t] y``.
* :func:`moda_attention`: MoDA's joint softmax over the causal sequence keys
  and the token's own depth keys (flash-style forward saving the
  log-sum-exp; backward kernels for every operand).

Under a mesh, :func:`over_batch` runs a kernel on each device's batch shard
(``shard_map``; :mod:`pallas_kernels.partition`), so XLA never gathers a
kernel's operands.  Each kernel's differentiable entry is jitted
(``backend.lowered_once``): identical calls in a program, one per sublayer
and again in the backward, are traced and lowered once.

Every kernel has a pure-``jnp`` ``*_reference`` beside it that computes what
the model's XLA path computes.  ``backend`` is ``auto`` (compiled on TPU via
Mosaic and on GPU via Triton, interpreted on CPU), ``tpu``, ``gpu``,
``interpret`` or ``interpret_gpu`` (see :mod:`pallas_kernels.backend`).
"""

from pallas_kernels.backend import BACKENDS, Target, resolve
from pallas_kernels.depth_attention import depth_attention, depth_attention_reference
from pallas_kernels.depth_attention_prefill import completed_sources_attention, merge_partial
from pallas_kernels.hc_pre import hc_operands, hc_pre, hc_pre_reference
from pallas_kernels.mhc_pre import mhc_operands, mhc_pre, mhc_pre_reference
from pallas_kernels.moda_attention import moda_attention, moda_attention_reference
from pallas_kernels.partition import over_batch
from pallas_kernels.stream_post import stream_post, stream_post_reference

__all__ = [
    "BACKENDS",
    "Target",
    "completed_sources_attention",
    "depth_attention",
    "depth_attention_reference",
    "hc_operands",
    "hc_pre",
    "hc_pre_reference",
    "merge_partial",
    "mhc_operands",
    "mhc_pre",
    "mhc_pre_reference",
    "moda_attention",
    "moda_attention_reference",
    "over_batch",
    "resolve",
    "stream_post",
    "stream_post_reference",
]
