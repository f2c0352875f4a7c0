"""The residual protocol: what a residual family supplies to the backbone.

A family is a frozen dataclass holding the static :class:`ModelSpec`.  It
creates its parameters inside Flax scopes the backbone hands it, and
otherwise consists of pure functions of (parameters, state, ...):

* ``init_state(g, x0_btd)``: the residual state from the embedding output;
* ``read(p, state, site) -> (h_btd, ctx)``: the input of sublayer ``site``
  (before the backbone's pre-norm, if the family uses one), and a context
  dict the sublayer may consume (moda: ``depth_kv``);
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

Families also report their costs (extra parameters, FLOPs, residual-state
memory) so that ``costs.py`` and ``depthbench families`` need no
family-specific code, and their weight-decay exclusions and init scales so
that the trainer and the backbone need none either.

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

from depthbench.model.spec import ModelSpec

State = Any  # a pytree; each family documents its own


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
# each small reduction to a YNNPACK call, which costs more than the work (a sum
# over the leading axis of [4, 8, 64, 64]: 316 us against 26 us as a chain; mhc
# at d 64, L 32: 0.45 -> 0.39 s a step with its Sinkhorn sums as chains).
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
    mod: nn.Module, name: str, init, shape: tuple[int, ...], axes: tuple[str | None, ...]
) -> jax.Array:
    """A family parameter: fp32 (routing maths stays fp32), logical axes for sharding."""
    return mod.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


def norm_param(mod: nn.Module, name: str, d: int) -> jax.Array:
    """A norm weight (init 1) with logical axis 'norm'."""
    return family_param(mod, name, nn.initializers.ones, (d,), ("norm",))


def with_axes(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
    """Logical sharding constraint on an activation (no-op without a mesh)."""
    return nn.with_logical_constraint(x, names)


BTD = ("activation_batch", "activation_length", "activation_embed")


@dataclasses.dataclass(frozen=True)
class ResidualFamily:
    """Base class: the pre_ln behaviour; families override what differs."""

    spec: ModelSpec

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    # Whether the backbone applies its own RMSNorm N_j before each sublayer.
    pre_norm: ClassVar[bool] = True
    # Parameter leaf names (anywhere in the tree) that take no weight decay.
    no_decay: ClassVar[frozenset[str]] = frozenset()
    # The family's own config fields, ``config.model.residual.<name>``: name ->
    # default (its type is the field's type).  A subclass adds to its bases'
    # (see :meth:`config_fields`); two families may share a field only with
    # one default.  ``validate`` checks their values.
    fields: ClassVar[dict[str, Any]] = {}
    # Logical axis name -> mesh axis (or None: replicated) for the axes this
    # family's parameters and state introduce; parallel.rules() appends them to
    # the backbone's table.
    sharding_rules: ClassVar[tuple[tuple[str, Any], ...]] = ()

    # ------------------------------------------------------------ validation
    @classmethod
    def config_fields(cls) -> dict[str, Any]:
        """Every field this family reads: its own ``fields`` and its bases'."""
        out: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            out.update(klass.__dict__.get("fields", {}))
        return out

    @classmethod
    def validate(cls, config) -> None:
        """Raise ConfigError for family fields out of range (one line)."""

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

    def input_scale(self, p: Any, x_in: jax.Array, site: Site) -> jax.Array:
        """Applied to the (normalised) sublayer input; lns scales it by 1/sqrt(l)."""
        return x_in

    def write(
        self, p: Any, state: State, y: jax.Array, site: Site, aux: dict, active: jax.Array
    ) -> State:
        return gate(active, state + y, state)

    def readout(self, g: Any, state: State, final_norm) -> jax.Array:
        return final_norm(state)

    def bank_slots(self, state: State, pos: jax.Array) -> dict[str, tuple[int, jax.Array]]:
        """The state's *banks* (leaves with a slot per depth source) and the slots
        the block at execution position ``pos`` may write: ``{leaf: (slot axis,
        slots [k], fresh, overwrite)}``, from the state before the block; ``fresh``
        (static, optional) promises those slots are still zero before it;
        ``overwrite`` (static, optional, with ``fresh``) also promises that the
        block *sets* them (never adds into them) and that its reads give slots
        not yet written zero weight, so running it on the final bank computes
        the same: the backward then keeps no bank carry.  It may read only the
        state's other leaves.  Listing them lets the layer stack keep memory
        linear in depth (``model/depth_scan.py``); a slot listed but not written
        is harmless.  Default ``{}``: no banks (the state is saved per block)."""
        return {}

    def bank_extent(self, positions: int) -> dict[str, int]:
        """Static bound on the bank slots the blocks at execution positions
        ``[0, positions)`` read or write: ``{bank leaf: n}``, the first ``n``
        slots along its slot axis (a leaf left out: all of them).  The depth-
        linear stack runs groups of positions on banks cut to this extent, so a
        family that gives one must take every bank's size from the bank itself
        (masks, clamps), never from its full size.  Skipped or permuted blocks
        only fill fewer slots, so the bound must hold for all-active blocks."""
        return {}

    def depth_state(self, g: Any, state: State) -> jax.Array:
        """``z``: the state at a block boundary as one vector per token
        (hc/mhc: streams concatenated; attnres: the mix the next sublayer reads)."""
        return state

    def lens_input(self, g: Any, state: State) -> jax.Array:
        """``r``: what the next consumer reads, for the logit lens (d wide)."""
        return state

    # ------------------------------------------------------------ analysis probes
    # What docs/spec/analysis.md needs from a family.  ``p`` is the per-block
    # tree of the block about to run (``None``: the readout, after the last
    # block); these are only traced when the backbone captures depth states.
    def analysis_option(self, name: str, default: Any) -> Any:
        """An analysis switch carried in ``spec.residual`` (absent in training specs)."""
        return dict(self.spec.residual).get(name, default)

    def boundary_state(self, p: Any, g: Any, state: State) -> jax.Array:
        """``z_l`` at a block's left boundary (``p`` None: ``z_L``), one vector per token."""
        return self.depth_state(g, state)

    def with_boundary_state(self, state: State, z: jax.Array) -> State:
        """A state whose next boundary state is ``z`` (the inverse of
        :meth:`boundary_state`, for analyses that inject or substitute a
        block's input or output), the same pytree structure as ``state``."""
        return z.astype(state.dtype)

    def lens_state(self, p: Any, g: Any, state: State) -> Any:
        """What the logit lens keeps at a block's left boundary (``p`` None: after
        the last block); :meth:`lens_decode` turns it into the LM head's input."""
        return state

    def lens_decode(self, g: Any, r: Any, final_norm) -> jax.Array:
        """The LM head's input from :meth:`lens_state`: the model's own readout,
        so the lens after the last block is exactly the model's output."""
        return self.readout(g, r, final_norm)

    def probe(self, p: Any, state: State, site: Site) -> dict:
        """Token-averaged routing of sublayer ``site`` read from the state it
        receives (attnres: depth weights over sources; hc/mhc: the residual
        mixing matrix).  Every leaf must have a static shape."""
        return {}

    def permute_params(self, params: Any, order: jax.Array) -> Any:
        """``params`` with position ``i`` running block ``order[i]``: each
        block's stacked weights move with it (families whose depth routing
        belongs to a block's *right* boundary move that too)."""
        params = dict(params)
        params["blocks"] = jax.tree.map(lambda a: jnp.take(a, order, axis=0), params["blocks"])
        return params

    # ------------------------------------------------------------ costs
    def extra_block_params(self) -> int:
        """Parameters a block has beyond pre_ln's (may be negative: no pre-norm)."""
        return 0

    def extra_global_params(self) -> int:
        return 0

    def extra_flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token beyond pre_ln's (routing, depth attention ...),
        multiply-add = 2, counting the matmuls of the family's own parameters
        here and only here (``costs`` counts ``2 N T`` over the shape's backbone
        parameters alone, so nothing is counted twice).  Norms, softmax and
        other element-wise work are left out, as for the backbone."""
        return 0.0

    def masked_flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token the XLA path spends on masked work that is
        not model FLOPs (depth slots not yet valid, computed then masked), in
        the convention of :meth:`extra_flops_per_token`.  Not part of any cost;
        the cross-check against XLA's count of the compiled program adds it."""
        return 0.0

    def layout(self) -> str:
        """How the family arranges depth at this shape, for ``depthbench costs``
        (attnres_block: its blocks); empty when there is nothing to say."""
        return ""

    def state_floats_per_token(self) -> int:
        """Floats of residual state kept per token (pre_ln: d_model)."""
        return self.spec.d_model

    def describe(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "reference": self.reference,
            "extra_block_params": self.extra_block_params(),
            "extra_global_params": self.extra_global_params(),
        }
