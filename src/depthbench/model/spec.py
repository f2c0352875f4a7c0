"""ModelSpec: the static, hashable description of one model.

Flax modules take a ``ModelSpec`` rather than a ConfigDict, so that they are
hashable (jit-static) and independent of how the experiment was written.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from depthbench.shapes import Shape, resolve_shape


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    family: str
    depth: int
    d_model: int
    d_ff: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    init_std: float = 0.02
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    attention_impl: str = "xla"
    scan_unroll: int = 1
    remat_policy: str = "nothing_saveable"
    impl: str = "xla"
    # Residual-family fields (config.model.residual), as sorted (name, value) pairs.
    residual: tuple[tuple[str, Any], ...] = ()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def shape(self) -> Shape:
        return Shape(
            self.depth, self.d_model, self.d_ff, self.n_heads, self.n_kv_heads, self.vocab_size
        )

    @property
    def dtype(self):
        return jnp.dtype(self.compute_dtype)

    @property
    def pdtype(self):
        return jnp.dtype(self.param_dtype)

    def r(self, name: str) -> Any:
        """A residual-family field, e.g. ``spec.r('hc_n')``."""
        for key, value in self.residual:
            if key == name:
                return value
        raise KeyError(f"model.residual.{name} is not a field")

    def replace(self, **kw) -> ModelSpec:
        return dataclasses.replace(self, **kw)

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
            impl=m.impl,
            residual=tuple(sorted(m.residual.to_dict().items())),
        )

    @classmethod
    def from_shape(cls, shape: Shape, family: str = "pre_ln", **kw) -> ModelSpec:
        """A spec from a Shape; residual fields default to base.py's."""
        from depthbench.config import base_config

        if "residual" not in kw:
            kw["residual"] = tuple(sorted(base_config().model.residual.to_dict().items()))
        return cls(
            family=family,
            depth=shape.depth,
            d_model=shape.d_model,
            d_ff=shape.d_ff,
            n_heads=shape.n_heads,
            n_kv_heads=shape.n_kv_heads,
            vocab_size=shape.vocab_size,
            **kw,
        )
