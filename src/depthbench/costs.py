"""Cost model: parameters, FLOPs, KV cache, residual-state memory and MFU.

Everything is a function of a :class:`~depthbench.model.spec.ModelSpec` and
needs no training.  The backbone terms are the LLaMA decoder's; a family adds
its own only through its ``CostTerms`` capability
(``model/residual/protocol/capabilities.py``), so this module never names a
family.  Formulas and conventions: docs/spec/analysis.md, "Costs"."""

from __future__ import annotations

from depthbench.model.residual.protocol.capabilities import CostTerms, cost_terms
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import family_of


def terms(spec: ModelSpec) -> CostTerms:
    """The cost terms of ``spec``'s family at its shape."""
    return cost_terms(family_of(spec))


def param_count(spec: ModelSpec) -> int:
    """Trainable parameters of the instantiated model (any family)."""
    fam = terms(spec)
    return (
        spec.shape.total_params + spec.depth * fam.extra_block_params() + fam.extra_global_params()
    )


def backbone_params(spec: ModelSpec) -> int:
    """Non-embedding parameters: the blocks (with the family's per-block
    extras).  The input embedding, LM head, final norm and the family's
    global parameters are excluded (Kaplan et al. 2020 count)."""
    return spec.shape.backbone_params + spec.depth * terms(spec).extra_block_params()


def attention_flops(spec: ModelSpec, seq_len: int) -> float:
    """Causal score + value products of all layers for one sequence (forward):
    ``2 * L * T^2 * d``."""
    return 2.0 * spec.depth * seq_len * seq_len * spec.d_model


def prefill_flops(spec: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs to prefill one sequence of ``seq_len`` tokens, LM head
    excluded (:func:`lm_head_flops`): ``2 * N_shape * T + 2 * L * T^2 * d +
    T * extra(T)``, where ``N_shape`` has no family parameters (their matmuls are
    in ``extra``)."""
    fam = terms(spec)
    return (
        2.0 * spec.shape.backbone_params * seq_len
        + attention_flops(spec, seq_len)
        + seq_len * float(fam.extra_flops_per_token(seq_len))
    )


def lm_head_flops(spec: ModelSpec, seq_len: int) -> float:
    """The untied LM head for one sequence: ``2 * V * d * T``."""
    return 2.0 * spec.vocab_size * spec.d_model * seq_len


def train_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Model FLOPs of one training step per token (forward + backward), as MaxText's
    ``calculate_tflops_training_per_device`` counts them:
    ``6 * (N_shape + V * d) + 6 * L * T * d + 3 * extra(T)``.  ``N_shape``
    includes the 2 RMSNorm weights per block, which MaxText leaves out (below
    1e-4 relative at every suite shape)."""
    fam = terms(spec)
    weights = 6.0 * (spec.shape.backbone_params + spec.vocab_size * spec.d_model)
    attention = 3.0 * attention_flops(spec, seq_len) / seq_len
    return weights + attention + 3.0 * float(fam.extra_flops_per_token(seq_len))


def model_flops_per_step(spec: ModelSpec, seq_len: int, tokens_per_step: int) -> float:
    """Model FLOPs of one optimizer step over ``tokens_per_step`` tokens (for MFU)."""
    return train_flops_per_token(spec, seq_len) * tokens_per_step


def kv_cache_bytes(spec: ModelSpec, seq_len: int, bytes_per_value: int = 2) -> int:
    """K and V of every layer for one sequence: ``2 * L * T * n_kv * head_dim *
    bytes`` (grouped-query attention caches only the ``n_kv`` shared heads)."""
    return 2 * spec.depth * seq_len * spec.n_kv_heads * spec.head_dim * bytes_per_value


def state_bytes_per_token(spec: ModelSpec, bytes_per_value: int = 2) -> int:
    """Residual-state activation memory per token (pre_ln: ``d``; hc/mhc keep
    ``n`` streams; attnres keeps its source bank)."""
    return int(terms(spec).state_floats_per_token()) * bytes_per_value


def cost_row(spec: ModelSpec, seq_len: int) -> dict:
    """Every cost of one shape at one sequence length (bf16 memory), with the
    family's overhead over pre_ln at the same shape as fractions (parameters;
    forward work over the backbone's prefill) and its depth layout, if any."""
    fam = terms(spec)
    extra_params = param_count(spec) - spec.shape.total_params
    extra_prefill = seq_len * float(fam.extra_flops_per_token(seq_len))
    return {
        "family": spec.family,
        "depth": spec.depth,
        "d_model": spec.d_model,
        "aspect_ratio": round(spec.d_model / spec.depth, 4),
        "params": param_count(spec),
        "prefill_flops": prefill_flops(spec, seq_len),
        "lm_head_flops": lm_head_flops(spec, seq_len),
        "train_flops_per_token": train_flops_per_token(spec, seq_len),
        "kv_cache_bytes": kv_cache_bytes(spec, seq_len),
        "state_bytes_per_token": state_bytes_per_token(spec),
        "params_overhead": extra_params / spec.shape.total_params,
        "prefill_overhead": extra_prefill / (prefill_flops(spec, seq_len) - extra_prefill),
        "layout": fam.layout(),
    }


# Dense (no 2:4 sparsity) bf16 peak FLOP/s per chip, i.e. per JAX device.
# TPU: Google Cloud TPU system-architecture pages (cloud.google.com/tpu/docs/
#   v4, /v5e, /v5p, /v6e): v4 275, v5e 197, v5p 459, v6e (Trillium) 918 TFLOPs.
# GPU: NVIDIA datasheets list bf16 tensor-core FLOPs "with sparsity"; dense is
#   half.  A100 (SXM and PCIe): 312 dense.  H100 SXM: 1,979 sparse -> 989.5;
#   H100 PCIe: 1,513 -> 756.5; H100 NVL: 1,671 -> 835.5.  H200 SXM: 1,979 ->
#   989.5; H200 NVL: 1,671 -> 835.5.  GH200 uses the H100 SXM core: 989.5.
_TERA = 1e12


def peak_flops(device_kind: str) -> float | None:
    """bf16 dense peak FLOP/s of one device named by ``jax.Device.device_kind``
    ("TPU v5 lite", "NVIDIA H100 80GB HBM3" ..., case and spacing ignored).
    ``None`` for an unknown device (CPU, other GPUs): an MFU is never computed
    against a guessed peak."""
    kind = " ".join(str(device_kind).lower().replace("-", " ").split())
    compact = kind.replace(" ", "")
    if compact.startswith("tpu"):
        tpu = {
            "tpuv4": 275.0,
            "tpuv5lite": 197.0,
            "tpuv5e": 197.0,
            "tpuv5": 459.0,
            "tpuv5p": 459.0,
            "tpuv6lite": 918.0,
            "tpuv6e": 918.0,
        }.get(compact)
        return None if tpu is None else tpu * _TERA
    words = kind.split()
    if "gh200" in compact:
        return 989.5 * _TERA
    if any(w.startswith("h200") for w in words):
        return (835.5 if "nvl" in words else 989.5) * _TERA
    if any(w.startswith("h100") for w in words):
        if "pcie" in words:
            return 756.5 * _TERA
        return (835.5 if "nvl" in words else 989.5) * _TERA
    if any(w.startswith("a100") for w in words):
        return 312.0 * _TERA
    return None


def mfu(flops_per_sec: float, device_kind: str, n_devices: int) -> float | None:
    """Achieved model FLOP/s over ``n_devices`` devices' summed peak; ``None`` when
    the peak is unknown."""
    peak = peak_flops(device_kind)
    if peak is None or n_devices < 1:
        return None
    return float(flops_per_sec) / (peak * n_devices)


__all__ = [
    "attention_flops",
    "backbone_params",
    "cost_row",
    "kv_cache_bytes",
    "lm_head_flops",
    "mfu",
    "model_flops_per_step",
    "param_count",
    "peak_flops",
    "prefill_flops",
    "state_bytes_per_token",
    "train_flops_per_token",
]
