"""moda: mixture-of-depths attention (Zhu et al. 2026), as the original benchmark built it.

Each attention head's one softmax covers the causal sequence keys of the
current block **and** depth keys at the same token written by earlier
sublayers.  The math, the original's choices and their sources (the
backbone's KV heads for the extra projection, the rotated depth query, pre-
or post-norm) and the variants: docs/spec/residuals.md, family 10.  Here:

* the attention sublayer of block ``b`` (execution position) writes its own
  pre-RoPE ``k, v`` (``aux["kv"]``, ``n_kv`` heads, no parameters) into
  attention slot ``b``; the MLP sublayer writes ``k, v`` from the extra
  linear ``depth_kv`` (``d -> 2 H d_h``, ``H = moda_kv_heads``, 0: the
  backbone's ``n_kv_heads``) on its input (``aux["x_in"]``) into MLP slot
  ``b``.  Query head ``h`` scores the MLP depth keys of head ``h // (n_heads
  / H)``, as GQA shares a key head;
* the attention of block ``b`` sees the slots ``0 .. b - 1`` of both kinds,
  so block 0 is ordinary causal attention.  The joint softmax is
  ``moda_attention.attention_with_depth``; the family hands it to the
  backbone's attention sublayer (``DepthAttention``).  With ``model.impl``
  pallas it runs in one fused kernel (``parts/fused.moda_attention``;
  ``pallas_kernels.moda_attention``), a decode step's cached keys and
  packed rows' segments aside (XLA, the same maths).

Only slots a later attention reads are kept: ``L - 1`` of each kind, so the
last block writes nothing (its MLP's extra linear is computed and dropped);
every block owns the extra linear so the scanned parameters have one shape,
and the last block's copy is unused (it is still counted in
``extra_block_params``: it exists and gets a zero gradient).

State: ``{"x": [B, T, d], "ka", "va": [B, T, n_kv, L-1, d_h], "kf", "vf":
[B, T, H, L-1, d_h], "valid": [L-1]}``: heads before slots, so the depth
dots (batched over ``B, T``, heads) and their backward read the caches
without transposed copies.  On the XLA path a deep stack's caches come in
chunks of slots (``chunks``: ``ka`` holds the first, ``ka1``, ``ka2`` ... the
next), and the depth-linear stack gives each position group only the chunks
of slots before its end (``bank_extent``): the depth attention of the early
blocks neither reads nor differentiates the later, still empty slots.  One
softmax covers all the chunks (and both kinds where their heads agree).
Slots follow execution positions; a skipped block (``active`` false) leaves
``x`` unchanged and its slots invalid: it writes no depth keys.  The caches
are in the compute dtype.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from depthbench.errors import ConfigError
from depthbench.model.depth_scan import position_groups, read_extents
from depthbench.model.layers import weight
from depthbench.model.residual.parts import fused
from depthbench.model.residual.parts.moda_attention import attention_with_depth
from depthbench.model.residual.protocol.base import (
    BTD,
    ResidualFamily,
    gate,
    norm_param,
    post_norm,
    rms_norm,
    with_axes,
)
from depthbench.model.residual.protocol.capabilities import (
    AnalysisProbes,
    BankSlots,
    CostTerms,
    DepthAttention,
    DepthBanks,
    Variants,
)
from depthbench.model.residual.protocol.family_config import (
    FamilyConfig,
    check_choice,
    check_number,
)
from depthbench.model.residual.protocol.original_format import (
    POST_NORMS,
    PRE_NORMS,
    Constant,
    OriginalFormat,
    Reading,
    linear,
)
from depthbench.shapes import resolve_shape

# Slots per chunk of each depth cache on the XLA path (at least; chunks end
# where the depth-linear stack's position groups end).
CHUNK = 8
BTKMH = ("activation_batch", "activation_length", "activation_kv_heads", "activation_sources", None)
_POST_NORM = ("attn_post_norm", "mlp_post_norm")
NORMS = ("post", "pre")
DEPTH_QUERIES = ("rotated", "unrotated")


@jax.custom_vjp
def put_slot(cache_btkmh: jax.Array, new_btkh: jax.Array, j: jax.Array, ok: jax.Array) -> jax.Array:
    """``cache[:, :, :, j] = new`` where ``ok`` (else unchanged), for a *fresh* slot.

    Forward: a scatter whose index is moved past the end where not ``ok``
    (dropped): no read of the old slot, whose cotangent would be a
    cache-sized zero tensor and add per write (more temp memory and a slower
    step: bench/results/code_notes.md).

    Backward: ``new`` gets the slot's cotangent; the cache's cotangent is
    passed on *as is*, slot ``j`` not zeroed.  Exact for what moda writes:
    each slot is written once, into the zeros of ``init_state`` (nothing
    upstream of the old slot has a gradient).  Why not zero it: in the
    backward scan the cotangent cache is a loop carry, updated in place by
    the depth attention's key gradients, and an in-place update not ordered
    after the slot's read made XLA copy each cotangent cache per block
    (d 64, L 32: four cache copies per block).  The read runs in a
    ``lax.cond`` so its result is materialised once (XLA fuses a plain slice
    into each consumer, the in-place add included, which orders nothing),
    and the pass-on adds zero taken from it: a data dependence that orders
    the update after the read (the copies gone, moda's step is faster and
    smaller: bench/results/depth_memory.md, "moda's cotangent caches passed
    on unzeroed").  A non-finite cotangent makes the cache's NaN: the run
    has diverged anyway."""
    jj = jnp.where(ok, j, cache_btkmh.shape[3])
    return cache_btkmh.at[:, :, :, jj].set(new_btkh.astype(cache_btkmh.dtype), mode="drop")


def _put_slot_fwd(cache_btkmh, new_btkh, j, ok):
    return put_slot(cache_btkmh, new_btkh, j, ok), (j, ok, jnp.zeros((), new_btkh.dtype))


def _put_slot_bwd(res, ct_btkmh):
    j, ok, new_like = res
    slots = ct_btkmh.shape[3]
    ct_new = jax.lax.cond(
        ok & (j < slots),
        lambda ct: jax.lax.dynamic_index_in_dim(ct, j, 3, keepdims=False).astype(new_like.dtype),
        lambda ct: jnp.zeros((*ct.shape[:3], ct.shape[4]), new_like.dtype),
        ct_btkmh)
    zero = jax.lax.stop_gradient(0 * ct_new[(0,) * ct_new.ndim])
    return ct_btkmh + zero.astype(ct_btkmh.dtype), ct_new, None, None


put_slot.defvjp(_put_slot_fwd, _put_slot_bwd)


def after(values, y):
    """``values``, made to depend on ``y`` (adds zero, no gradient).

    The attention that computed ``y`` read the caches that ``values`` are
    then written into, but ``k, v`` are computed before it: XLA then may not
    order the in-place update after those reads, and copied each cache twice
    per block to update it (d 64, L 32: four bank-sized copies per block).
    Only a data dependence orders them (an optimization barrier did not).
    A non-finite ``y`` makes ``values`` NaN: the run has diverged anyway."""
    zero = jax.lax.stop_gradient(0.0 * y[(0,) * y.ndim])
    return jax.tree.map(lambda v: v + zero.astype(v.dtype), values)


@dataclasses.dataclass(frozen=True)
class MoDAConfig(FamilyConfig, Variants):
    moda_kv_heads: int = 0  # heads of the MLP's depth K/V projection; 0 = the model's KV heads
    moda_depth_query: str = "rotated"  # "rotated" (the reference kernel) | "unrotated"
    moda_norm: str = "pre"  # "pre": x <- x + F(N(x)) (the original's) | "post": N(x + F(x))

    variants = {
        "pre_norm": {"moda_norm": "pre"},
        "post_norm": {"moda_norm": "post"},
        "unrotated_query": {"moda_depth_query": "unrotated"},
        "lean": {"moda_kv_heads": 2, "moda_norm": "post"},
    }

    def validate(self, config) -> None:
        check_choice("moda_norm", self.moda_norm, NORMS)
        check_choice("moda_depth_query", self.moda_depth_query, DEPTH_QUERIES)
        check_number("moda_kv_heads", self.moda_kv_heads, 0, integer=True,
                     meaning="depth K/V heads of the MLP projection; 0 = model's KV heads")
        shape = resolve_shape(config)
        heads = int(self.moda_kv_heads) or shape.n_kv_heads
        if shape.n_heads % heads:
            raise ConfigError(f"config.model.residual.moda_kv_heads: {heads} must divide the "
                              f"{shape.n_heads} attention heads")


@dataclasses.dataclass(frozen=True)
class MoDA(ResidualFamily, DepthBanks, DepthAttention, CostTerms, AnalysisProbes,
           OriginalFormat):
    name = "moda"
    description = (
        "mixture-of-depths attention: one softmax over the causal sequence keys and "
        "the same token's keys from earlier sublayers"
    )
    reference = "Zhu et al. 2026, Mixture-of-Depths Attention (arXiv 2603.15619; hustvl/MoDA)"
    Config = MoDAConfig
    sharding_rules = (("activation_sources", None),)  # the depth-KV caches' slot axis
    # The original's MoDA blocks (block.py@6bdf2ad, nn/moda.py@100da5f) through its
    # launchers' configure_moda (examples/moda_common.py@6bdf2ad): pre-norm "moda",
    # post-norm "post_norm_moda"; the sublayers wrapped as attention.attention and
    # feed_forward.feed_forward; the last block's FFN depth K/V skipped by a
    # block override.
    original_blocks = ("moda", "post_norm_moda")
    original_fields = {"moda": (None,), "moda_skip_ffn_kv": (None, False),
                       "block_overrides": (None, {})}
    original_sublayers = ("attention.attention.", "feed_forward.feed_forward.")

    # ------------------------------------------------------------ layout
    @property
    def n_slots(self) -> int:
        """``L - 1`` slots of each kind: blocks whose keys a later attention reads."""
        return max(self.spec.depth - 1, 0)

    @property
    def chunks(self) -> tuple[tuple[int, int], ...]:
        """The slot spans ``[start, end)`` of each depth cache's chunks: one chunk
        under the Pallas kernel; on the XLA path spans of at least ``CHUNK``
        slots ending where the depth-linear stack's position groups end, so
        that a group's blocks read only the chunks of slots before its end
        (``bank_extent``): at L 32, 4 chunks of 8, 8, 8 and 7 slots, and the
        first 8 blocks read 8 slots of each kind, not 31.  (Writing only the
        chunk a group writes, where the shapes tell it, measured no faster than
        a ``put_slot`` into each chunk present: bench/results/depth_memory.md,
        "moda's caches in chunks".)"""
        m = self.n_slots
        if m == 0:
            return ()
        if fused.use_pallas(self.spec) or m <= CHUNK:
            return ((0, m),)
        spans, start = [], 0
        for _, end in position_groups(self.spec.depth):
            end = min(end, m)
            if end - start >= CHUNK or (end == m and start < m):
                if end == m and spans and end - start < CHUNK // 2:
                    spans[-1] = (spans[-1][0], m)  # a short tail joins the chunk before
                else:
                    spans.append((start, end))
                start = end
        return tuple(spans)

    @staticmethod
    def _key(cache: str, c: int) -> str:
        """The state leaf of chunk ``c`` of ``cache`` (``ka``, ``va``, ``kf``, ``vf``)."""
        return cache if c == 0 else f"{cache}{c}"

    @property
    def kv_heads(self) -> int:
        """``H``: heads of the MLP's depth key/value projection."""
        return int(self.cfg.moda_kv_heads) or self.spec.n_kv_heads

    @property
    def pre_norm(self) -> bool:  # type: ignore[override]
        return self.cfg.moda_norm == "pre"

    @property
    def rotated_query(self) -> bool:
        return self.cfg.moda_depth_query == "rotated"

    # ------------------------------------------------------------ parameters
    def create_block_params(self, mod, ident):
        s = self.spec
        p = {
            "depth_kv": weight(
                mod,
                "depth_kv",
                (s.d_model, 2, self.kv_heads, s.head_dim),
                ("embed", None, "kv_heads", "head_dim"),
                s,
            )
        }
        if not self.pre_norm:
            p.update({k: norm_param(mod, k, s.d_model, s.pdtype) for k in _POST_NORM})
        return p

    # ------------------------------------------------------------ protocol
    def init_state(self, g, x0):
        s, m = self.spec, self.n_slots
        b, t, _ = x0.shape
        state = {"x": x0}
        for c, (start, end) in enumerate(self.chunks):
            attn = with_axes(jnp.zeros((b, t, s.n_kv_heads, end - start, s.head_dim), x0.dtype),
                             BTKMH)
            mlp = with_axes(jnp.zeros((b, t, self.kv_heads, end - start, s.head_dim), x0.dtype),
                            BTKMH)
            state |= {self._key("ka", c): attn, self._key("va", c): attn,
                      self._key("kf", c): mlp, self._key("vf", c): mlp}
        return {**state, "valid": jnp.zeros((m,), bool)}

    def read(self, p, state, site):
        return state["x"], {}

    def attention(self, p, state, site):
        """The joint softmax over the sequence keys and the depth caches (the
        rotated or the pre-RoPE query meets the depth keys: ``moda_depth_query``).
        With ``model.impl`` pallas (or auto choosing it) in one fused kernel
        (``pallas_kernels.moda_attention``), except where the sublayer also sees
        a decoder's cached keys or packed rows' segments: those run in XLA."""
        if self.n_slots == 0:
            return None
        valid = state["valid"]
        groups = tuple((state[self._key(k, c)], state[self._key(v, c)], valid[start:end])
                       for k, v in (("ka", "va"), ("kf", "vf"))
                       for c, (start, end) in enumerate(self.chunks)
                       if state[self._key(k, c)].shape[3])  # not left out by bank_extent
        rotated = self.rotated_query
        pallas = fused.use_pallas(self.spec)

        def attend(q, qr, kr, v, past, segments=None):
            depth_query = qr if rotated else q
            if pallas and past is None and segments is None:
                return fused.moda_attention(qr, kr, v, depth_query, groups)
            # A decode step's cached keys and packed rows' segments: XLA's parts.
            return attention_with_depth(qr, kr, v, depth_query, groups, past, segments)

        return attend

    def _depth_kv(self, p, x_in_btd):
        """The MLP's depth ``k, v`` ``[B, T, H, d_h]``, one product each (one
        product of both made two transposed copies to split them)."""
        s = self.spec
        x, w = x_in_btd.astype(s.dtype), p["depth_kv"].astype(s.dtype)
        return (jnp.einsum("btd,dkh->btkh", x, w[:, 0]), jnp.einsum("btd,dkh->btkh", x, w[:, 1]))

    def _residual(self, p, x, y, sub: int):
        if self.pre_norm:
            return x + y
        return post_norm(rms_norm, x, y, p[_POST_NORM[sub]], self.spec.norm_eps)

    def write(self, p, state, y, site, aux, active):
        x = with_axes(gate(active, self._residual(p, state["x"], y, site.sub), state["x"]), BTD)
        m = self.n_slots
        if m == 0:
            return {**state, "x": x}
        b = site.pos
        ok = active & (b < m)
        if site.sub == 0:
            k, v = after(aux["kv"], y)
            new = self._put(state, ("ka", "va"), (k, v), b, ok)
            return {**state, **new, "x": x}
        # The last block's MLP keys are never read (put_slot drops them), but
        # computing them costs less than a ``lax.cond`` around the product in
        # every block, forward and backward (bench/results/depth_memory.md,
        # "the deep-narrow step").
        k, v = self._depth_kv(p, aux["x_in"])
        new = self._put(state, ("kf", "vf"), (k, v), b, ok)
        return {**state, **new, "x": x,
                "valid": state["valid"] | ((jnp.arange(m) == b) & ok)}

    def _put(self, state, caches, values, b, ok):
        """Slot ``b`` of each of ``caches`` set to its value where ``ok``: in the
        chunk holding it, among the chunks the state has (the depth-linear stack
        leaves out those past its group's end)."""
        out = {}
        for c, (start, end) in enumerate(self.chunks):
            if not state[self._key(caches[0], c)].shape[3]:
                continue
            ok_c = ok & (b >= start) & (b < end)
            for cache, value in zip(caches, values, strict=True):
                key = self._key(cache, c)
                out[key] = with_axes(put_slot(state[key], value, b - start, ok_c), BTKMH)
        return out

    def bank_slots(self, state, pos):
        """The block at position ``b`` writes slot ``b`` of each depth cache (the
        last block's ``b = L - 1`` is past the end: it writes none)."""
        out = {}
        for c, (start, end) in enumerate(self.chunks):
            # past the end where the chunk does not hold slot ``pos``
            slots = jnp.where((pos >= start) & (pos < end), pos - start, end - start)[None]
            # Never written before; put_slot sets the slot, and the depth attention
            # masks the slots not yet written (``valid``): overwrite.
            out |= {self._key(k, c): BankSlots(3, slots, True, True)
                    for k in ("ka", "va", "kf", "vf")}
        return out

    def bank_extent(self, positions: int) -> dict[str, int]:
        """Whole chunks: those holding a slot below ``positions`` (the blocks
        before it write slots ``< positions`` and read slots below their own),
        the others none.  The stack's cuts are then all or nothing, so no cut
        copies a chunk; the depth attention visits the present chunks' slots.
        (Cut at the slot, the caches' cuts were copies that cost as much time
        as the skipped slots saved, and more memory: bench/results/
        depth_memory.md, "the deep-narrow step".)"""
        return {self._key(k, c): (end - start if start < positions else 0)
                for c, (start, end) in enumerate(self.chunks)
                for k in ("ka", "va", "kf", "vf")}

    def readout(self, g, state, final_norm):
        return final_norm(state["x"])

    # ------------------------------------------------------------ analysis probes
    def boundary_state(self, p, g, state):
        return state["x"]

    def with_boundary_state(self, state, z):
        return {**state, "x": z.astype(state["x"].dtype)}

    def lens_state(self, p, g, state):
        """Only the stream the readout reads (the depth cache stays out of captures)."""
        return {"x": state["x"]}

    # ------------------------------------------------------------ costs
    def extra_block_params(self) -> int:
        """The MLP sublayer's key/value projection ``d x 2 H d_h`` (post-norm's two
        norms replace the two pre-norms: no change)."""
        s = self.spec
        return 2 * s.d_model * self.kv_heads * s.head_dim

    def extra_flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token beyond pre_ln's, multiply-add = 2:

        * depth attention: the attention of the block at position ``b`` scores
          and averages ``2b`` depth keys (``b`` attention, ``b`` MLP) per query
          head, ``2 d_h`` FLOPs each for ``q . k`` and for ``p v``: ``4 d`` per
          key over the ``n_heads`` heads; summed over ``b``: ``4 d L (L - 1)``
          (no causal halving: every depth key is visible);
        * the extra projection in the ``L - 1`` MLPs that write:
          ``2 d (2 H d_h)`` each."""
        s = self.spec
        attn = 4 * s.d_model * s.depth * (s.depth - 1)
        proj = (s.depth - 1) * 2 * s.d_model * 2 * self.kv_heads * s.head_dim
        return float(attn + proj)

    def masked_flops_per_token(self, seq_len: int) -> float:
        """The attention at position ``b`` scores every slot its caches hold, all
        ``2 (L - 1)`` or, under the depth-linear stack, those of the chunks
        present in its position group (``bank_extent``), and masks the ones not
        yet written (all but ``b``): ``4 d`` FLOPs each.  Not model FLOPs."""
        s, m = self.spec, self.n_slots
        return float(4 * s.d_model * sum(2 * (seen - b) for b, seen in
                                          enumerate(self._depth_visits()) if m > b))

    def _depth_visits(self) -> list[int]:
        """Slots of each kind the depth attention at each execution position
        visits: all ``L - 1`` under ``layer_scan = "carries"`` (or one chunk);
        under the depth-linear stack, the chunks its position group holds."""
        s, m = self.spec, self.n_slots
        if s.layer_scan != "depth_linear" or len(self.chunks) <= 1:
            return [m] * s.depth
        return [sum(n for k, n in e.items() if k.startswith("ka"))
                for e in read_extents(s.depth, self.bank_extent)]

    def state_floats_per_token(self) -> int:
        """The stream ``d`` plus the depth caches ``2 (L-1) (n_kv + H) d_h``."""
        s = self.spec
        return s.d_model + 2 * self.n_slots * (s.n_kv_heads + self.kv_heads) * s.head_dim

    def layout(self) -> str:
        """``kv=16+16,pre-norm,rotated-q``: depth K/V heads (attention + MLP), norm
        placement, the query the depth keys meet."""
        return (f"kv={self.spec.n_kv_heads}+{self.kv_heads},{self.cfg.moda_norm}-norm,"
                f"{self.cfg.moda_depth_query}-q")

    def describe(self) -> dict:
        return {**super().describe(), "depth_slots": 2 * self.n_slots,
                "depth_kv_heads": self.kv_heads, "norm": self.cfg.moda_norm,
                "depth_query": self.cfg.moda_depth_query}

    # ------------------------------------------------------------ the original's format
    @classmethod
    def from_original(cls, block, saved, options):
        moda = block.sub_or_empty("moda")
        moda.must(moda.opt("extra_ffn_kv_proj") is not False and not moda.opt(
            "extra_attn_kv_proj"), "only the configuration configure_moda trains is supported "
            "(extra_ffn_kv_proj true, extra_attn_kv_proj false)")
        model = saved["model"]
        last = str(int(model["n_layers"]) - 1)
        overrides = {str(k): v for k, v in (model.get("block_overrides") or {}).items()}
        ignore = {"moda_skip_ffn_kv", "_CLASS_"}

        def same(o) -> bool:
            return isinstance(o, dict) and {k: v for k, v in o.items() if k not in ignore} == {
                k: v for k, v in block.data.items() if k not in ignore}

        if overrides:
            block.must(set(overrides) == {last} and same(overrides[last])
                       and overrides[last].get("moda_skip_ffn_kv"),
                       f"model.block_overrides for blocks {sorted(overrides)}: only the MoDA "
                       "last-block override (moda_skip_ffn_kv) is supported")
        else:
            block.must(not block.opt("moda_skip_ffn_kv"),
                       "moda_skip_ffn_kv on every block is not supported")
        name = block.opt("name")
        return Reading(block=name, residual={
            "moda_kv_heads": 0, "moda_norm": "post" if name == "post_norm_moda" else "pre",
            "moda_depth_query": "rotated"})

    def to_original(self):
        if int(self.cfg.moda_kv_heads) or self.cfg.moda_depth_query != "rotated":
            raise ConfigError("the original's MoDA projects depth K/V with the model's KV heads "
                              "and meets them with the rotated query; this moda has "
                              f"moda_kv_heads {self.cfg.moda_kv_heads}, "
                              f"{self.cfg.moda_depth_query} query")
        return {"name": "moda" if self.pre_norm else "post_norm_moda",
                "moda": {"extra_ffn_kv_proj": True, "extra_attn_kv_proj": False}}

    def original_model(self, block):
        """configure_moda's last-block override: the same block, its FFN depth K/V
        skipped (nothing reads it)."""
        return {"block_overrides": {str(self.spec.depth - 1): {**block,
                                                                 "moda_skip_ffn_kv": True}}}

    def original_norms(self, i):
        return PRE_NORMS if self.pre_norm else POST_NORMS

    def original_block_tensors(self, i):
        """``feed_forward.kv_proj`` (``view(B, T, 2, n_kv, h)``: rows ``(k|v, head,
        h)``), none on the last block: nothing reads its FFN depth K/V."""
        s = self.spec
        if i == s.depth - 1:
            return [Constant("blocks/residual/depth_kv", (i,), 0.0)]
        rows = 2 * self.kv_heads * s.head_dim
        return [linear("feed_forward.kv_proj.weight", rows, s.d_model, "blocks/residual/depth_kv",
                       (i,), (s.d_model, 2, self.kv_heads, s.head_dim))]
