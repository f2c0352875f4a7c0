"""What a residual family may declare beyond the core protocol (``base.py``).

Each capability is a small interface a family opts into by deriving from it
(``class MoDA(ResidualFamily, DepthBanks, DepthAttention, ...)``); whoever
needs it tests ``isinstance(family, Capability)`` (``issubclass`` for a
family class or a config class), never ``getattr``.  A family without a
capability behaves as pre_ln does there: no banks, no costs beyond the
backbone, a state of one vector per token, no learning-rate rule.

* :class:`DepthBanks`: state leaves with a slot per depth source, so the
  layer stack keeps memory linear in depth (attnres, moda);
* :class:`DepthAttention`: the attention sublayer's softmax also covers keys
  the family keeps in its state (moda);
* :class:`PositionState`: what a decoder keeps for the family from one
  token position to the next, beyond the attention keys and values (none of
  the built-in families: their state is per token);
* :class:`ScaledInput`: a factor on a sublayer's normalised input (lns);
* :class:`PreNormEps`: the eps of the backbone's pre-norm, per sublayer
  (attnres: its mixes' fused norms use ``attnres_eps``);
* :class:`CostTerms`: parameters, FLOPs and state beyond pre_ln's, for
  ``costs.py`` and ``depthbench families`` / ``costs``;
* :class:`AnalysisProbes`: the state as one vector per token at a block
  boundary, the logit lens's input, routing probes, and what moves with a
  permuted block (docs/spec/analysis.md);
* :class:`AnalysisOptions`: switches between definitions of an analysis
  (attnres's skip, swap and probe rules), chosen per analysis, never trained;
* :class:`LearningRateRule`: a depth-transfer rule for AdamW, per-leaf
  learning-rate and epsilon factors, applied under ``train.lr_rule =
  "family"`` (CompleteP's);
* :class:`Variants` (of a family's *config*): named sets of its field values
  a sweep appends to the family's name (``hc+sum_then_norm``);
* :class:`~depthbench.model.residual.protocol.original_format.OriginalFormat` (its own
  module): the family's checkpoints in the original benchmark's format, both
  ways (its block configs and tensors: ``import-olmo``).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax

State = Any  # a pytree; each family documents its own


# --------------------------------------------------------------- depth banks


class BankSlots(NamedTuple):
    """The slots of one bank leaf a block may write (see :meth:`DepthBanks.bank_slots`)."""

    axis: int  # the leaf's slot axis
    slots: jax.Array  # [k] slot indices (may be past the end: written nowhere)
    fresh: bool = False  # static: the slots are still zero before the block
    overwrite: bool = False  # static, with fresh: the block sets them, reads of unset slots weigh 0


class DepthBanks(abc.ABC):
    """A state with *banks*: leaves with a slot per depth source (attnres's
    source bank, moda's depth-KV caches).  Listing them lets the layer stack
    keep memory linear in depth (``model/depth_scan.py``)."""

    @abc.abstractmethod
    def bank_slots(self, state: State, pos: jax.Array) -> dict[str, BankSlots]:
        """The state's bank leaves and the slots the block at execution position
        ``pos`` may write, from the state before the block.  ``fresh`` promises
        those slots are still zero before it; ``overwrite`` (with ``fresh``) also
        promises that the block *sets* them (never adds into them) and that its
        reads give slots not yet written zero weight, so running it on the final
        bank computes the same: the backward then keeps no bank carry.  It may
        read only the state's other leaves; a slot listed but not written is
        harmless.  ``{}``: no banks at this shape (the state is saved per block)."""

    def bank_extent(self, positions: int) -> dict[str, int]:
        """Static bound on the bank slots the blocks at execution positions
        ``[0, positions)`` read or write: ``{bank leaf: n}``, the first ``n``
        slots along its slot axis (a leaf left out: all of them).  The depth-
        linear stack runs groups of positions on banks cut to this extent, so a
        family that gives one must take every bank's size from the bank itself
        (masks, clamps), never from its full size.  Skipped or permuted blocks
        only fill fewer slots, so the bound must hold for all-active blocks."""
        return {}


# ------------------------------------------------------- sublayer extensions

# (pre-RoPE query, rotated query, rotated keys, values, past, segments) -> attention
# output [B, T, n, h]; past: None, or a decode step's cached keys of earlier positions
# (model/past_attention.PastKeys), which every token also sees; segments: None, or the
# document of each token of a packed row [B, T] (no token sees another's keys).
Attend = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, Any, Any], jax.Array]


class DepthAttention(abc.ABC):
    """The attention sublayer's softmax covers more than the causal sequence keys."""

    @abc.abstractmethod
    def attention(self, p: Any, state: State, site) -> Attend | None:
        """The attention sublayer ``site`` runs, from the state it reads: a function
        of the sublayer's query, keys and values (``Attend``), or None for the
        backbone's own causal attention.  In a decode step it also receives the
        cached sequence keys (``past``) and must include them in its softmax; in a
        packed row the tokens' documents (``segments``), which its sequence keys
        must respect."""


# ------------------------------------------------------------ decoding


class PositionState(abc.ABC):
    """State a family carries from one token position to later ones, beyond the
    attention keys and values a decoder caches for every family.

    A family without it keeps a state of its own per token (one vector, ``n``
    streams, a bank of the same token's sources, the same token's depth
    keys): a decode step rebuilds it from the new token's embedding with
    ``init_state``, and the decoder caches nothing for the family.  A family
    whose state at a token also depends on earlier tokens declares here what
    a decoder keeps between steps (the *carry*) and how a step resumes from it;
    its full forward computes the same state from the whole sequence."""

    @abc.abstractmethod
    def resume(self, g: Any, state: State, carry: Any) -> State:
        """The state ``init_state`` made for new tokens, continued from the carry
        of the tokens before them (what :meth:`carry` returned)."""

    @abc.abstractmethod
    def carry(self, g: Any, state: State, at_b: jax.Array) -> Any:
        """What the tokens up to ``at_b`` ``[B]`` (each row's last one) leave for
        later positions, read from the state after the last block: a pytree of
        arrays with a leading batch axis."""


class ScaledInput(abc.ABC):
    """A factor on each sublayer's input after the backbone's pre-norm."""

    @abc.abstractmethod
    def input_scale(self, p: Any, x_in: jax.Array, site) -> jax.Array:
        """``x_in`` (the normalised sublayer input) as the sublayer receives it."""


class PreNormEps(abc.ABC):
    """The eps of the backbone's pre-norm ``N_j`` is the family's, not ``norm_eps``."""

    @abc.abstractmethod
    def pre_norm_eps(self, site) -> float | jax.Array:
        """The eps of sublayer ``site``'s pre-norm (may be traced: ``site.pos`` is)."""


# ---------------------------------------------------------------------- costs


class CostTerms:
    """What a family adds to pre_ln's costs at its shape (``self.spec``); a
    family overrides the terms that are not pre_ln's."""

    spec: Any

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

    def state_floats_per_token(self) -> int:
        """Floats of residual state kept per token (pre_ln: d_model)."""
        return self.spec.d_model

    def layout(self) -> str:
        """How the family arranges depth at this shape, for ``depthbench costs``
        (attnres_block: its blocks); empty when there is nothing to say."""
        return ""


@dataclasses.dataclass(frozen=True)
class BackboneCosts(CostTerms):
    """The cost terms of a family that declares none: pre_ln's."""

    spec: Any


def cost_terms(family) -> CostTerms:
    """The family's cost terms (pre_ln's when it declares none)."""
    return family if isinstance(family, CostTerms) else BackboneCosts(family.spec)


# ------------------------------------------------------------------ analysis


class AnalysisProbes:
    """What docs/spec/analysis.md needs from a family, for a state of one vector
    per token by default; a family with another state overrides them.  ``p`` is
    the per-block tree of the block about to run (``None``: the readout, after
    the last block); these are only traced when the backbone captures depth
    states or an analysis runs block by block."""

    def boundary_state(self, p: Any, g: Any, state: State) -> jax.Array:
        """``z_l`` at a block's left boundary (``p`` None: ``z_L``), one vector per token."""
        return state

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

    def probe(self, p: Any, state: State, site) -> dict:
        """Token-averaged routing of sublayer ``site`` read from the state it
        receives (attnres: depth weights over sources; hc/mhc: the residual
        mixing matrix).  Every leaf must have a static shape."""
        return {}

    def permute_boundaries(self, original: Any, params: Any, order: jax.Array) -> Any:
        """``params`` (blocks already permuted from ``original`` by ``order``) with
        whatever else moves with a block: a family whose depth routing belongs to
        a block's *right* boundary moves that too (attnres)."""
        return params


@dataclasses.dataclass(frozen=True)
class VectorState(AnalysisProbes):
    """The analysis probes of a family that declares none: its state is one
    vector per token, read out by the family's own readout."""

    family: Any

    def readout(self, g: Any, state: State, final_norm) -> jax.Array:
        return self.family.readout(g, state, final_norm)


def probes(family) -> AnalysisProbes:
    """The family's analysis probes (those of a one-vector state when it declares none)."""
    return family if isinstance(family, AnalysisProbes) else VectorState(family)


class AnalysisOptions:
    """Switches between definitions of an analysis, chosen when a run is
    analysed (``depthbench analyze --skip-rule ...``) and carried in
    ``ModelSpec.analysis``, never in the training config."""

    # option -> its values, the first the default (the original benchmark's)
    analysis_options: ClassVar[dict[str, tuple[str, ...]]] = {}
    spec: Any

    def option(self, name: str) -> str:
        """The value of analysis option ``name`` in this spec (else its default)."""
        return dict(self.spec.analysis).get(name, self.analysis_options[name][0])


# ----------------------------------------------------------------- training


class LearningRateRule(abc.ABC):
    """A depth-transfer rule for AdamW (CompleteP's), applied when
    ``train.lr_rule = "family"``: per-leaf learning-rate factors, decoupled
    weight decay scaled with them, and a factor on Adam's epsilon."""

    @abc.abstractmethod
    def lr_multipliers(self, params: Any) -> Any:
        """Per-leaf learning-rate factor (python floats, same tree as ``params``)."""

    @abc.abstractmethod
    def eps_multipliers(self, params: Any) -> Any:
        """Per-leaf factor on AdamW's epsilon (python floats, same tree as ``params``)."""


class Variants:
    """Named choices of a family's config a sweep may append to the family's
    name with ``+`` (``hc+sum_then_norm``, :mod:`depthbench.variants`): each a
    set of the config's own field values.  Declared on the config class."""

    variants: ClassVar[dict[str, dict[str, Any]]] = {}  # name -> {field: value}
