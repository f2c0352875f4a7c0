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
        # (lax.stage) per shape and dtype.  Where ``x`` was placed, so a sharded
        # (a run's) tree stays as it was.
        moved = (np.asarray(x, np.float64) + noise).astype(x.dtype)
        return jax.device_put(moved, getattr(x, "sharding", None))

    return jax.tree_util.tree_map_with_path(move, params)


def init_perturbed(model: nn.Module, tokens_bt, init_seed: int = 1, noise_seed: int = 2,
                   scale: float = 0.3):
    """``model``'s unboxed initial parameters for ``tokens_bt`` (one compiled
    program) plus ``scale * N(0, 1)`` noise on every leaf."""
    params = jax.jit(model.init)(jax.random.key(init_seed), tokens_bt)["params"]
    return perturbed(nn.unbox(params), noise_seed, scale)


def normal(rng, shape, scale: float = 1.0, dtype=np.float32) -> np.ndarray:
    """``scale * N(0, 1)`` drawn in fp32 by numpy (``rng``: a seed or a
    ``np.random.Generator``, whose stream it continues), then cast to ``dtype``
    (``jnp.bfloat16`` works): a numpy array, which ``jax.jit`` takes as it is and
    ``jax.device_put`` puts on the device; ``jax.random`` would compile a
    random-bits program per shape, and ``jnp.asarray`` outside a trace a
    conversion per shape and dtype (``lax.stage``)."""
    draws = np.random.default_rng(rng).standard_normal(shape, np.float32)
    return (scale * draws).astype(dtype)
