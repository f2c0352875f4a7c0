"""ModelSpec: the static, hashable description of one model.

Flax modules take a ``ModelSpec`` rather than a ConfigDict, so they are
jit-static and independent of how the experiment was written: the
:class:`~depthbench.shapes.Shape`, the numerics, the family's own fields as
sorted ``(name, value)`` pairs (a field left out takes the family's default)
and ``analysis``, the analysis switches a family declares (empty in training)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from depthbench.shapes import Shape, resolve_shape


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    family: str
    shape: Shape
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    init_std: float = 0.02
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    attention_impl: str = "xla"
    scan_unroll: int = 1
    remat_policy: str = "nothing_saveable"
    layer_scan: str = "depth_linear"
    impl: str = "xla"
    # Residual-family fields (config.model.residual), as sorted (name, value) pairs.
    residual: tuple[tuple[str, Any], ...] = ()
    # Analysis switches of the family, as sorted (option, value) pairs; empty in training.
    analysis: tuple[tuple[str, str], ...] = ()

    # The shape's fields, read through (the model code says spec.depth, spec.d_model ...).
    depth = property(lambda self: self.shape.depth)
    d_model = property(lambda self: self.shape.d_model)
    d_ff = property(lambda self: self.shape.d_ff)
    n_heads = property(lambda self: self.shape.n_heads)
    n_kv_heads = property(lambda self: self.shape.n_kv_heads)
    vocab_size = property(lambda self: self.shape.vocab_size)
    head_dim = property(lambda self: self.shape.head_dim)

    @property
    def dtype(self):
        return jnp.dtype(self.compute_dtype)

    @property
    def pdtype(self):
        return jnp.dtype(self.param_dtype)

    def replace(self, **kw) -> ModelSpec:
        return dataclasses.replace(self, **kw)

    def with_fields(self, **fields: Any) -> ModelSpec:
        """The spec with these residual-family fields set (the others as they were)."""
        return self.replace(residual=tuple(sorted({**dict(self.residual), **fields}.items())))

    @classmethod
    def from_config(cls, config) -> ModelSpec:
        m = config.model
        return cls.from_shape(
            resolve_shape(config),
            family=m.family,
            norm_eps=float(m.norm_eps),
            rope_theta=float(m.rope_theta),
            init_std=float(m.init_std),
            param_dtype=m.param_dtype,
            compute_dtype=m.compute_dtype,
            attention_impl=m.attention_impl,
            scan_unroll=int(m.scan_unroll),
            remat_policy=m.remat_policy,
            layer_scan=m.layer_scan,
            impl=m.impl,
            residual=tuple(sorted(m.residual.to_dict().items())),
        )

    @classmethod
    def from_shape(cls, shape: Shape, family: str, **kw) -> ModelSpec:
        """A spec of ``family`` from a Shape; the family's fields default to its
        declared ones (``registry.baseline()`` names the plain backbone)."""
        return cls(family=family, shape=shape, **kw)
