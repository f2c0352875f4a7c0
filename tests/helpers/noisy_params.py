"""Model parameters moved off their initial values, and random test inputs,
without compiling anything.

Many tests perturb a model's parameters first: at init a family's queries or
projections are zero, so its mixes are uniform or static and a wrong
implementation can agree with the reference by accident.  The noise is drawn
and added in numpy: with ``jax.random`` each leaf's shape costs a compiled
random-bits program (seconds on CPU for a small model, in every test).
:func:`normal` draws a test's inputs the same way.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import linen as nn


def perturbed(params, seed: int, scale: float = 0.3, only: str | None = None):
    """``params`` plus ``scale * N(0, 1)`` noise drawn from numpy's generator
    seeded with ``seed`` (leaf by leaf, in the tree's order), kept in each leaf's
    dtype; with ``only``, just the leaves whose path contains that name (e.g.
    ``"residual"``: the family's own parameters)."""
    rng = np.random.default_rng(seed)

    def move(path, x):
        noise = scale * rng.standard_normal(x.shape)
        if only is not None and only not in jax.tree_util.keystr(path):
            return x
        # device_put, not jnp.asarray: outside a trace jnp.asarray compiles a program
        # (lax.stage) per shape and dtype.
        return jax.device_put((np.asarray(x, np.float64) + noise).astype(x.dtype))

    return jax.tree_util.tree_map_with_path(move, params)


def init_perturbed(model: nn.Module, tokens_bt, init_seed: int = 1, noise_seed: int = 2,
                   scale: float = 0.3):
    """``model``'s unboxed initial parameters for ``tokens_bt`` (one compiled
    program) plus ``scale * N(0, 1)`` noise on every leaf."""
    params = jax.jit(model.init)(jax.random.key(init_seed), tokens_bt)["params"]
    return perturbed(nn.unbox(params), noise_seed, scale)


def normal(rng: np.random.Generator, shape, scale: float = 1.0, dtype=np.float32) -> jax.Array:
    """``scale * N(0, 1)`` draws from ``rng`` as a device array of ``dtype`` (drawn in
    fp32, then cast), compiling nothing: ``jax.random`` compiles a random-bits
    program per shape, and ``jnp.asarray`` outside a trace one conversion per
    shape and dtype (``lax.stage``); ``jax.device_put`` copies."""
    return jax.device_put((scale * rng.standard_normal(shape)).astype(np.float32).astype(dtype))
