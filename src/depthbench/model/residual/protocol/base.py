"""The residual protocol's core: what every residual family supplies to the backbone.

A family is a frozen dataclass holding the static :class:`ModelSpec`; it
reads the spec's residual fields as its typed config (``Config``, a
:class:`~depthbench.model.residual.protocol.family_config.FamilyConfig`): ``self.cfg``.  It
creates its parameters inside Flax scopes the backbone hands it, and
otherwise consists of pure functions of (parameters, state, ...):

* ``init_state(g, x0_btd)``: the residual state from the embedding output;
* ``read(p, state, site) -> (h_btd, ctx)``: the input of sublayer ``site``
  (before the backbone's pre-norm, if the family uses one), and a context
  dict its ``write`` receives back (attnres: the MLP side's partial mix);
* ``write(p, state, y_btd, site, aux, active) -> state``: fold the sublayer
  output back; ``aux`` holds the sublayer's normalised input ``x_in``, the
  ``ctx`` its read returned and, for attention, its pre-RoPE ``kv``; where
  ``active`` is false the state must come back unchanged (that is how a
  block is skipped).  The state between a block's two sublayers may carry
  extra leaves (attnres: the MLP side's partial mix, computed with the
  attention side's); the state a block returns has the keys it was given;
* ``readout(g, state, final_norm) -> x_btd``: the normalised vector fed to
  the LM head (families that normalise streams separately need the norm).

``p`` is the pytree made by :meth:`create_block_params` (per block, stacked
over depth by the backbone's scan, so it moves with a permuted block) and
``g`` the one made by :meth:`create_global_params` (outside the scan).
``Site`` names where a sublayer runs: its kind, its execution position and
its original block identity (they differ only when blocks are permuted).
Init scales, weight-decay exclusions and the sharding rules of the logical
axes a family introduces complete the core.  Everything else (depth banks,
cost terms, analysis probes, a learning-rate rule, variants ...) is an
opt-in capability (``capabilities.py``).

Names of arrays carry their axes as a suffix, one letter each, in order
(the convention of the whole package): ``b`` batch, ``t`` sequence
position, ``d`` features (the model width; the head dim after a head axis),
``h`` attention head (the head dim after ``k`` or ``m``), ``k`` key/value
head, ``n`` or ``s`` residual stream (``u`` the streams a mix writes), ``m``
depth slot, ``v`` vocabulary: ``x_btd`` is ``[batch, time, d_model]``,
``h_nbtd`` ``n`` streams of it, ``x_bthd`` per-head vectors.

Under the ``matmuls_saveable`` rematerialisation policy (the micro config's
default, ``transformer.remat_policy``) the backward keeps every matmul's
output and recomputes the elementwise work between them; a value that is
costly to recompute for another reason (an iteration, a batched product)
is kept by marking it with :func:`keep_for_backward`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from depthbench.model.residual.protocol.capabilities import State
from depthbench.model.residual.protocol.family_config import FamilyConfig
from depthbench.model.spec import ModelSpec


class Site(NamedTuple):
    """Where a sublayer runs.  ``pos``/``ident`` may be traced (inside scan)."""

    sub: int  # 0 = attention, 1 = MLP (static)
    pos: jax.Array  # execution index of the block, 0 .. L-1
    ident: jax.Array  # original index of the block (differs from pos when permuted)

    @property
    def j(self) -> jax.Array:
        """Execution index of the sublayer, 0 .. 2L-1."""
        return 2 * self.pos + self.sub

    @property
    def j_ident(self) -> jax.Array:
        """Original index of the sublayer (what its parameters were made for)."""
        return 2 * self.ident + self.sub


KEEP = "keep_for_backward"  # the checkpoint name :func:`keep_for_backward` gives


def keep_for_backward(x: jax.Array) -> jax.Array:
    """``x`` itself, marked for the ``matmuls_saveable`` policy to keep for the
    backward rather than recompute (no effect without that policy)."""
    return checkpoint_name(x, KEEP)


def gate(active: jax.Array, new: State, old: State) -> State:
    """``new`` where the block is active, ``old`` (identity) where skipped."""
    return jax.tree.map(lambda n, o: jnp.where(active, n, o), new, old)


# Reductions over a short axis (a stream family's n streams, mhc's n x n
# mixing) as a chain of elementwise ops over the axis's slices: XLA:CPU hands
# each small reduction to a YNNPACK call, which costs more than the work
# (bench/results/cpu_step.md, "Sinkhorn" and "Stream mixes").
SHORT_AXIS = 8


def _short_axis_reduce(x: jax.Array, axis: int, op, full) -> jax.Array:
    """Reduction of ``x`` over ``axis`` (keepdims): a chain of the binary ``op``
    over the axis's slices when it is at most ``SHORT_AXIS`` long, else ``full``."""
    n = x.shape[axis]
    if n > SHORT_AXIS:
        return full(x, axis=axis, keepdims=True)
    return functools.reduce(op, [jax.lax.slice_in_dim(x, i, i + 1, axis=axis) for i in range(n)])


def axis_sum(x: jax.Array, axis: int) -> jax.Array:
    """``sum(x, axis, keepdims=True)``, as a chain of adds when the axis is short."""
    return _short_axis_reduce(x, axis, jnp.add, jnp.sum)


def axis_max(x: jax.Array, axis: int) -> jax.Array:
    """``max(x, axis, keepdims=True)``, as a chain of maxima when the axis is short."""
    return _short_axis_reduce(x, axis, jnp.maximum, jnp.max)


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """x / rms(x) over the last axis, computed in fp32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (x32 * inv).astype(x.dtype)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm with a learned weight (fp32 statistics)."""
    return rms_normalize(x, eps) * weight.astype(x.dtype)


def layer_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Mean-centred LayerNorm without bias (DeepNorm's LN), fp32 statistics."""
    x32 = x.astype(jnp.float32)
    x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    return (rms_normalize(x32, eps) * weight.astype(jnp.float32)).astype(x.dtype)


def post_norm(norm, state: jax.Array, y: jax.Array, weight: jax.Array, eps: float,
              carry: float | jax.Array | None = None) -> jax.Array:
    """``norm(carry * x + y)``, the write of the post-norm families (post_ln,
    deepnorm, keel); ``carry`` None means 1.

    The sum is formed in fp32: with a large ``carry`` (deepnorm's ``(2L)^(1/4)``,
    keel's ``2L``) the branch is a small correction that bf16 would round away
    before the norm.  Returned in ``x``'s dtype."""
    x32 = state.astype(jnp.float32)
    total = (x32 if carry is None else carry * x32) + y.astype(jnp.float32)
    return norm(total, weight, eps).astype(state.dtype)


def family_param(
    mod: nn.Module, name: str, init, shape: tuple[int, ...], axes: tuple[str | None, ...],
    dtype=jnp.float32,
) -> jax.Array:
    """A family parameter: fp32 unless the family stores it otherwise (mhc's
    ``phi`` in bf16, as Liger's mHC does), logical axes for sharding.  Routing
    maths runs in fp32 whatever the storage."""
    return mod.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.dtype(dtype))


def norm_param(mod: nn.Module, name: str, d: int, dtype=jnp.float32) -> jax.Array:
    """A norm weight (init 1) with logical axis 'norm'; the backbone's norms and a
    family's post-norms are stored in ``model.param_dtype`` (the original builds
    them in its model dtype), attnres's key norms in fp32."""
    return family_param(mod, name, nn.initializers.ones, (d,), ("norm",), dtype)


def with_axes(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
    """Logical sharding constraint on an activation (no-op without a mesh)."""
    return nn.with_logical_constraint(x, names)


BTD = ("activation_batch", "activation_length", "activation_embed")


@dataclasses.dataclass(frozen=True)
class ResidualFamily:
    """Base class: the pre_ln behaviour; families override what differs."""

    spec: ModelSpec
    # The family's fields (``self.cfg.hc_n``): ``spec.residual`` as its ``Config``.
    cfg: FamilyConfig = dataclasses.field(init=False, repr=False, compare=False)

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    # The family's typed config, ``config.model.residual`` (family_config.py).
    Config: ClassVar[type[FamilyConfig]] = FamilyConfig
    # Whether the backbone applies its own RMSNorm N_j before each sublayer.
    pre_norm: ClassVar[bool] = True
    # The plain backbone every family is measured against (one family sets it:
    # registry.baseline(); equal compute's speedups, import-hf's LLaMA).
    baseline: ClassVar[bool] = False
    # Parameter leaf names (anywhere in the tree) that take no weight decay.
    no_decay: ClassVar[frozenset[str]] = frozenset()
    # Logical axis name -> mesh axis (or None: replicated) for the axes this
    # family's parameters and state introduce; parallel.rules() appends them to
    # the backbone's table.
    sharding_rules: ClassVar[tuple[tuple[str, Any], ...]] = ()

    def __post_init__(self):
        # The spec's residual pairs as the family's typed config (the rest default).
        object.__setattr__(self, "cfg", self.Config.from_fields(dict(self.spec.residual),
                                                                self.name))

    @classmethod
    def config_fields(cls) -> dict[str, Any]:
        """The family's fields and their defaults."""
        return cls.Config.defaults()

    # ------------------------------------------------------------ parameters
    def create_block_params(self, mod: nn.Module, ident: jax.Array) -> Any:
        """Per-block parameters (created in ``mod``'s scope; ``ident`` may be traced)."""
        return {}

    def create_global_params(self, mod: nn.Module) -> Any:
        """Parameters outside the layer stack (e.g. a readout query)."""
        return {}

    def init_scale(self, matrix: str) -> float:
        """Multiplier on the init std of a backbone matrix.

        ``matrix`` is one of 'q', 'k', 'v', 'o' (attention) and 'gate', 'up',
        'down' (SwiGLU)."""
        return 1.0

    # ------------------------------------------------------------ protocol
    def init_state(self, g: Any, x0: jax.Array) -> State:
        return x0

    def read(self, p: Any, state: State, site: Site) -> tuple[jax.Array, dict]:
        return state, {}

    def write(
        self, p: Any, state: State, y: jax.Array, site: Site, aux: dict, active: jax.Array
    ) -> State:
        return gate(active, state + y, state)

    def readout(self, g: Any, state: State, final_norm) -> jax.Array:
        return final_norm(state)

    def describe(self) -> dict:
        """What ``depthbench families`` shows: name, description, reference and
        the family's settings at this shape."""
        return {"name": self.name, "description": self.description, "reference": self.reference}
