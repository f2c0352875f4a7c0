"""attnres_full and attnres_block: Attention Residuals (Kimi, 2026).

Each sublayer's input is a softmax mix over depth *sources*, ``h = sum_i
softmax_i(q . (w * v_i / rms(v_i))) v_i`` in fp32 (values raw, no 1/sqrt(d)),
then the usual ``F_j(N_j(h))``; a pseudo-query ``q`` (init 0: every mix starts
uniform) and key-norm weight ``w`` (init 1) per sublayer, one more pair for the
readout.  The math, the two block partitions (``attnres_partition``), the
epsilon and their sources: docs/spec/residuals.md, families 8 and 9; depth
states, the logit lens, skips and swaps (the family's analysis options):
docs/spec/analysis.md.

How the code holds it:

* one fixed-size bank of ``M`` slots (logical axis 'activation_sources'),
  ``[B, T, M, d]`` on the XLA path (each token's sources side by side: the
  mixes read it in place, ``parts/depth_mix.py``), ``[M, B, T, d]`` for the
  fused kernels (``slot_axis``); ``M = 1 +`` the number of blocks
  (:func:`block_sizes`; ``2L + 1`` for attnres_full), and a count ``c`` of
  the sublayers executed so far.  Slot 0 holds ``x0``; sublayer output
  ``y_c`` is *added* into slot ``1 + block_of[c]`` (a scatter-add into one
  slot, never the whole bank), the block's running partial until it is
  complete, so the embedding is never summed into a partial.  The mix
  before sublayer ``c`` sees slots ``0 .. started[c]``, ``started[c]`` the
  number of blocks holding one of the sublayers ``0 .. c-1``: the spec's
  commit-then-mix rule.  The first sublayer reads ``x0`` exactly (one
  source) and keeps the backbone's pre-norm eps; every other pre-norm, the
  key norms and the final norm use ``attnres_eps`` (``PreNormEps``);
* a skipped block (``active`` false) adds nothing and does not advance ``c``:
  the following blocks fill the bank in *execution* order, as if it were
  removed (the analyses' "next-output" rule is the state's ``skipped``
  flag).  ``q``, ``w`` are block parameters, so they move with a permuted
  block; every block owns both pairs (the first block's attention pair is
  unused);
* on the XLA path a block's two mixes share one set of passes over the bank
  (the two-phase form): before the attention side, its mix and the MLP side's
  partial mix over the slots up to ``covered = block_of[c]`` (with their
  log-sum-exp); after the write, that partial merged with the slot written
  (``merge_source``, an online softmax), or the partial alone after a
  skipped attention side.  Each slot's inverse RMS is kept in the state
  (``inv_rms``, ``[B, T, M]``, set when the slot is written).  Both make the
  CPU step faster (bench/results/code_notes.md).  With ``model.impl=pallas``
  each mix is one fused kernel call and ``inv_rms`` is not kept.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from depthbench.errors import ConfigError
from depthbench.model.depth_scan import read_extents
from depthbench.model.residual.parts import fused
from depthbench.model.residual.parts.depth_mix import (
    depth_mixes,
    depth_weights,
    merge_source,
    slot_inv_rms,
)
from depthbench.model.residual.protocol.base import (
    BTD,
    ResidualFamily,
    family_param,
    norm_param,
    with_axes,
)
from depthbench.model.residual.protocol.capabilities import (
    AnalysisOptions,
    AnalysisProbes,
    BankSlots,
    CostTerms,
    DepthBanks,
    PreNormEps,
    Variants,
)
from depthbench.model.residual.protocol.family_config import (
    FamilyConfig,
    check_choice,
    check_number,
)
from depthbench.model.residual.protocol.original_format import (
    Constant,
    OriginalFormat,
    Place,
    Reading,
    Tensor,
    vector,
)

MBTD = ("activation_sources", *BTD)  # the kernels' bank
BTMD = (*BTD[:2], "activation_sources", BTD[2])  # the XLA path's bank


PARTITIONS = ("size", "count")


def block_sizes(depth: int, blocks: int, block_size: int = 0,
                partition: str = "count") -> tuple[int, ...]:
    """Sublayers per block over the ``2L`` sublayers, in order.

    ``block_size > 0``: blocks of ``block_size``, the last keeps the remainder.
    Otherwise, ``partition = "size"``: blocks of ``ceil(2L / blocks)`` the same
    way (the original benchmark's); ``"count"``: exactly ``blocks`` blocks when
    ``2L >= blocks``, ``q = 2L // blocks`` sublayers each, the first ``2L mod
    blocks`` of them one more, and ``2L`` blocks of one sublayer when ``2L <
    blocks``."""
    total = 2 * int(depth)
    if block_size <= 0 and partition == "size":
        block_size = -(-total // int(blocks))
    if block_size > 0:
        full, rest = divmod(total, int(block_size))
        return (int(block_size),) * full + ((rest,) if rest else ())
    n = min(int(blocks), total)
    q, r = divmod(total, n)
    return (q + 1,) * r + (q,) * (n - r)


def describe_blocks(sizes: tuple[int, ...]) -> str:
    """``(5, 5, 4, 4)`` -> ``'2x5+2x4'``: runs of blocks x sublayers each, in order."""
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    return "+".join(f"{count}x{size}" for size, count in runs)


@dataclasses.dataclass(frozen=True)
class AttnResConfig(FamilyConfig):
    attnres_eps: float = 1e-5  # key norms, fused pre-norms, final norm (OLMo-core's default)

    # Run directories saved before the field used model.norm_eps (1e-6 by default).
    saved_before = {"attnres_eps": 1e-6}

    def validate(self, config) -> None:
        check_number("attnres_eps", self.attnres_eps, 0.0, 1e-2, exclusive=True,
                     meaning="eps of the key norms, the fused pre-norms and the final norm")


@dataclasses.dataclass(frozen=True)
class AttnResFull(ResidualFamily, DepthBanks, CostTerms, AnalysisProbes, AnalysisOptions,
                  PreNormEps, OriginalFormat):
    name = "attnres_full"
    description = (
        "Attention Residuals: each sublayer reads a softmax mix over the embedding "
        "and every earlier sublayer output"
    )
    reference = "Kimi Team 2026, Attention Residuals (arXiv 2603.15031)"
    Config = AttnResConfig
    sharding_rules = (("activation_sources", None),)  # the source bank's slot axis
    # The first value is the original benchmark's definition (docs/spec/analysis.md
    # "Options"): z_l read by the next consumer, the "next-output" rule for a
    # skipped block, a swap moving each block's right-boundary mix.
    analysis_options = {
        "probe_rule": ("next_consumer", "readout"),
        "skip_rule": ("next_output", "remove"),
        "swap_rule": ("right_boundary", "block"),
    }

    # ------------------------------------------------------------ layout
    @property
    def blocks(self) -> tuple[int, ...]:
        """Sublayers per block, in order (full: ``2L`` blocks of one)."""
        return (1,) * (2 * self.spec.depth)

    @property
    def eps(self) -> float:
        """The eps of the key norms, the mixes' pre-norms and the final norm."""
        return float(self.cfg.attnres_eps)

    def pre_norm_eps(self, site):
        """``attnres_eps`` for every sublayer input that is a mix; the first
        sublayer to run reads ``x0`` alone, normed with the backbone's eps."""
        return jnp.where(site.j == 0, jnp.float32(self.spec.norm_eps), jnp.float32(self.eps))

    @property
    def n_slots(self) -> int:
        """Bank slots ``M``: ``x0`` plus one per block."""
        return 1 + len(self.blocks)

    @property
    def block_of(self) -> tuple[int, ...]:
        """``block_of[c]``: the block of sublayer ``c``, ``c = 0 .. 2L-1``."""
        return tuple(b for b, size in enumerate(self.blocks) for _ in range(size))

    @property
    def started(self) -> tuple[int, ...]:
        """``started[c]``, ``c = 0 .. 2L``: blocks holding one of sublayers ``0 .. c-1``."""
        return (0, *(b + 1 for b in self.block_of))

    @property
    def slot_axis(self) -> int:
        """The bank's slot axis: 2 (``[B, T, M, d]``) on the XLA path, 0 (``[M, B,
        T, d]``) for the fused kernels; ``inv_rms`` (XLA only) is ``[B, T, M]``."""
        return 0 if fused.use_pallas(self.spec) else 2

    def _bank_axes(self) -> tuple:
        return MBTD if self.slot_axis == 0 else BTMD

    def _slot_count(self, bank) -> int:
        """The slots ``bank`` has (the layer stack may cut it: ``bank_extent``)."""
        return bank.shape[self.slot_axis]

    def _valid(self, count, bank) -> jax.Array:
        """Slots a mix sees after ``count`` executed sublayers: ``0 .. started[count]``."""
        started = jnp.asarray(self.started, jnp.int32)
        return jnp.arange(self._slot_count(bank)) <= started[count]

    # ------------------------------------------------------------ parameters
    def create_block_params(self, mod, ident):
        d = self.spec.d_model
        return {
            "query": family_param(mod, "query", nn.initializers.zeros, (2, d), (None, "embed")),
            "key_norm": family_param(mod, "key_norm", nn.initializers.ones, (2, d), (None, "norm")),
        }

    def create_global_params(self, mod):
        d = self.spec.d_model
        return {
            "query": family_param(mod, "query", nn.initializers.zeros, (d,), ("embed",)),
            "key_norm": norm_param(mod, "key_norm", d),
        }

    # ------------------------------------------------------------ protocol
    def init_state(self, g, x0):
        ax = self.slot_axis
        x0_slot = jnp.expand_dims(x0, ax)
        empty = jnp.zeros(x0_slot.shape[:ax] + (self.n_slots - 1,) + x0_slot.shape[ax + 1:],
                          x0.dtype)
        bank = with_axes(jnp.concatenate([x0_slot, empty], axis=ax), self._bank_axes())
        # ``skipped`` (analyses only; 0 in training): 1 the last block was
        # skipped, 2 the newest source was injected (``with_boundary_state``).
        zero = jnp.zeros((), jnp.int32)
        state = {"bank": bank, "count": zero, "skipped": zero}
        if not fused.use_pallas(self.spec):  # the kernels compute r in their one pass
            r0_btm = slot_inv_rms(x0, self.eps)[..., None]
            empty_r = jnp.zeros((*r0_btm.shape[:2], self.n_slots - 1), jnp.float32)
            state["inv_rms"] = with_axes(jnp.concatenate([r0_btm, empty_r], axis=2), BTMD[:3])
        return state

    def _newest(self, count) -> jax.Array:
        """The newest valid slot after ``count`` executed sublayers (0: ``x0``)."""
        return jnp.asarray(self.started, jnp.int32)[count]

    def _consumer_valid(self, state) -> jax.Array:
        """The slots of a block boundary's mix (the next block's attention side,
        or the readout).  After a skipped block only the newest source, so the
        mix is the identity on it (the original benchmark's "next-output" rule),
        unless the analysis option ``skip_rule`` is "remove" (the mix runs as
        usual).  A softmax over one source weighs it exactly 1, and its gradient
        passes only ``dh`` to that slot: a read of the slot, without a second
        bank-sized cotangent."""
        bank, count = state["bank"], state["count"]
        rule = self.option("skip_rule") == "next_output"
        only_newest = jnp.arange(self._slot_count(bank)) == self._newest(count)
        return jnp.where(state["skipped"] >= (1 if rule else 2), only_newest,
                         self._valid(count, bank))

    def _one_mix(self, state, valid_m, query, key_norm):
        bank = state["bank"]
        if "inv_rms" not in state:
            return fused.depth_mix(bank, valid_m, query, key_norm, self.eps)
        h_btkd, _ = depth_mixes(bank, state["inv_rms"], valid_m[:, None], query[None],
                                key_norm[None])
        return h_btkd[:, :, 0].astype(bank.dtype)

    def _consumer_mix(self, state, query, key_norm):
        return self._one_mix(state, self._consumer_valid(state), query, key_norm)

    def read(self, p, state, site):
        if site.sub == 1 and "next_mix" in state:
            h_btd, lse_bt, covered, newest_btd, newest_r_bt = state["next_mix"]
            merged = merge_source(h_btd, lse_bt, newest_btd, newest_r_bt, p["query"][1],
                                  p["key_norm"][1])
            # A skipped attention side added no source: the partial is the whole mix.
            return jnp.where(self._newest(state["count"]) > covered, merged,
                             h_btd.astype(newest_btd.dtype)), {}
        if site.sub == 0 and "inv_rms" in state:
            return self._mix_pair(p, state)
        valid = self._consumer_valid(state) if site.sub == 0 else self._valid(
            state["count"], state["bank"])
        return self._one_mix(state, valid, p["query"][site.sub], p["key_norm"][site.sub]), {}

    def _mix_pair(self, p, state):
        """Both mixes of the block in one set of passes over the bank (the
        two-phase form of the AttnRes paper): the attention side's, and the
        MLP side's over the slots up to ``covered`` (those the attention
        side's write leaves alone), to be merged with the slot it writes."""
        bank, count = state["bank"], state["count"]
        covered = jnp.asarray(self.block_of, jnp.int32)[jnp.minimum(count, len(self.block_of) - 1)]
        valid_mk = jnp.stack([self._consumer_valid(state),
                              jnp.arange(self._slot_count(bank)) <= covered], axis=-1)
        h_btkd, lse_btk = depth_mixes(bank, state["inv_rms"], valid_mk, p["query"], p["key_norm"])
        partial = (h_btkd[:, :, 1], lse_btk[:, :, 1], covered)
        return h_btkd[:, :, 0].astype(bank.dtype), {"next_mix": partial}

    def write(self, p, state, y, site, aux, active):
        bank, count = state["bank"], state["count"]
        slot = 1 + jnp.asarray(self.block_of, jnp.int32)[jnp.minimum(count, len(self.block_of) - 1)]
        # An add into one slot (the slot is in range: ``bank_extent``; clamped as
        # a dynamic_update_slice would): its cotangent passes the bank's through
        # unchanged, where read-add-write makes a bank-sized select and add.
        ax = self.slot_axis
        slot = jnp.minimum(slot, self._slot_count(bank) - 1)
        add_btd = jnp.where(active, y.astype(bank.dtype), jnp.zeros(y.shape, bank.dtype))
        bank = bank.at[(slice(None),) * ax + (slot,)].add(add_btd, mode="promise_in_bounds")
        skipped = jnp.where(active, 0, 1) if site.sub == 1 else state["skipped"]
        out = {"bank": with_axes(bank, self._bank_axes()),
               "count": count + active.astype(jnp.int32), "skipped": skipped}
        if "inv_rms" in state:
            # The slot's new value: the output itself where slots are written
            # once (full), the block's partial otherwise.  Read back from the
            # bank only then: the read's cotangent is a bank-sized pass.
            value_btd = add_btd if max(self.blocks) == 1 else jax.lax.dynamic_index_in_dim(
                bank, slot, axis=ax, keepdims=False)
            out["inv_rms"], r_bt = self._with_inv_rms(state["inv_rms"], slot, value_btd, active)
            if "next_mix" in aux.get("ctx", {}):
                out["next_mix"] = (*aux["ctx"]["next_mix"], value_btd, r_bt)
        return out

    def _with_inv_rms(self, inv_rms_btm, slot, value_btd, changed):
        """``inv_rms_btm`` with ``slot`` holding ``value_btd``'s inverse RMS where
        ``changed``, and that slot's entry."""
        old_bt = jax.lax.dynamic_index_in_dim(inv_rms_btm, slot, axis=2, keepdims=False)
        new_bt = jnp.where(changed, slot_inv_rms(value_btd, self.eps), old_bt)
        inv_rms_btm = jax.lax.dynamic_update_index_in_dim(inv_rms_btm, new_bt, slot, axis=2)
        return with_axes(inv_rms_btm, BTMD[:3]), new_bt

    def bank_slots(self, state, pos):
        """The block adds into the slots of sublayers ``count`` and ``count + 1``."""
        block_of = jnp.asarray(self.block_of, jnp.int32)
        last = len(self.block_of) - 1
        count = state["count"]
        slots = 1 + block_of[jnp.minimum(jnp.stack([count, count + 1]), last)]
        # Blocks of one sublayer (full): both slots are still empty before the block.
        fresh = max(self.blocks) == 1
        return {k: BankSlots(self.slot_axis, slots, fresh) for k in ("bank", "inv_rms")
                if k in state}

    def bank_extent(self, positions: int) -> dict[str, int]:
        """Blocks ``[0, p)`` run sublayers ``c < 2p``: they mix slots up to
        ``started[c]`` and add into ``1 + block_of[c] <= started[2p]``."""
        n = 1 + self.started[min(2 * int(positions), len(self.started) - 1)]
        return {"bank": n, "inv_rms": n}

    def readout(self, g, state, final_norm):
        return final_norm(self._consumer_mix(state, g["query"], g["key_norm"]), eps=self.eps)

    # ------------------------------------------------------------ analysis probes
    def boundary_state(self, p, g, state):
        """``z_l``: the raw mix block ``l``'s attention side computes (its own
        query and key norm); after the last block (or under ``probe_rule =
        "readout"``), the readout's mix, before ``N_out``."""
        if p is None or self.option("probe_rule") == "readout":
            return self._consumer_mix(state, g["query"], g["key_norm"])
        return self._consumer_mix(state, p["query"][0], p["key_norm"][0])

    def with_boundary_state(self, state, z):
        """The newest source replaced by ``z`` and marked so that the next
        consumer's mix returns it (the "next-output" rule): the block that
        follows reads exactly ``z``, and later mixes see ``z`` in that slot."""
        newest = self._newest(state["count"])
        z_btd = z.astype(state["bank"].dtype)
        bank = jax.lax.dynamic_update_index_in_dim(state["bank"], z_btd, newest,
                                                   axis=self.slot_axis)
        out = {**state, "bank": with_axes(bank, self._bank_axes()),
               "skipped": jnp.full((), 2, jnp.int32)}
        if "inv_rms" in state:
            out["inv_rms"], _ = self._with_inv_rms(state["inv_rms"], newest, z_btd, True)
        return out

    def lens_state(self, p, g, state):
        return self.boundary_state(p, g, state)

    def lens_decode(self, g, r, final_norm):
        return final_norm(r, eps=self.eps)

    def probe(self, p, state, site):
        """``depth_weights`` ``[M]``: the token-averaged softmax weight sublayer
        ``site`` puts on each bank slot (0: the embedding; unfilled slots 0)."""
        w = depth_weights(jnp.moveaxis(state["bank"], self.slot_axis, 0),
                          self._valid(state["count"], state["bank"]),
                          p["query"][site.sub], p["key_norm"][site.sub], self.eps)
        w_m = jnp.mean(w, axis=(1, 2))  # a cut bank (``bank_extent``): the rest are unfilled
        return {"depth_weights": jnp.pad(w_m, (0, self.n_slots - w_m.shape[0]))}

    def permute_boundaries(self, original, params, order):
        """Each block takes along the mix that produces its *right* boundary
        (the next block's attention-side ``q``, ``w``; the readout's for the
        last block), as the original benchmark's swap does; the attention-side
        pair at position 0 (a mix over ``x0`` alone) stays."""
        if self.option("swap_rule") != "right_boundary":
            return params
        params = dict(params)
        blocks, res = dict(params["blocks"]), dict(params["blocks"]["residual"])
        glob = dict(params["residual"])
        for name in ("query", "key_norm"):
            # right[b]: the pair that produces block b's right boundary (original order).
            right = jnp.concatenate([original["blocks"]["residual"][name][1:, 0],
                                     original["residual"][name][None]], axis=0)
            moved = jnp.take(right, order, axis=0)  # ... of the block now at position i
            res[name] = res[name].at[1:, 0].set(moved[:-1])
            glob[name] = moved[-1]
        blocks["residual"] = res
        params["blocks"], params["residual"] = blocks, glob
        return params

    # ------------------------------------------------------------ costs
    def extra_block_params(self) -> int:
        """``q`` and ``w`` for each of the two sublayers: ``2 * 2d``."""
        return 4 * self.spec.d_model

    def extra_global_params(self) -> int:
        """The readout's ``q`` and ``w``: ``2d``."""
        return 2 * self.spec.d_model

    def sources_per_token(self) -> int:
        """Sources mixed per token over a forward pass: for the sublayer after
        ``c >= 1`` executed ones, ``1 + started[c]``; the readout, all ``M``.  The
        first sublayer's mix has the single source ``x0`` and is not counted
        (it reads ``x0``).  Full: ``2L^2 + 3L``."""
        started = self.started
        return sum(1 + started[c] for c in range(1, 2 * self.spec.depth)) + self.n_slots

    def extra_flops_per_token(self, seq_len: int) -> float:
        """``4 d`` per source per mix, the logit ``v . (q * w)`` and the weighted
        sum (2 FLOPs per element each; the softmax over sources is negligible),
        and ``2 d`` per written slot for its RMS, computed once when the slot
        is written (``x0`` and each of the ``2L`` writes) and kept beside the
        bank.  (The fused kernels recompute the RMS at every mix instead.)"""
        d = self.spec.d_model
        return float(4 * d * self.sources_per_token() + 2 * d * (2 * self.spec.depth + 1))

    def masked_flops_per_token(self, seq_len: int) -> float:
        """The XLA path mixes over the bank's slots at each of the ``2L`` sublayers
        (the first one too; all ``M`` or the group's extent, ``_mix_visits``) and
        masks the slots not yet valid: ``4 d`` for each of those ``visits + M -
        sources`` slot visits (the readout visits all ``M``); and per block
        ``6 d`` for the MLP side's merge with the newest source (its logit and
        the blend), which the block's pass over the bank also visited, masked.
        Not model FLOPs."""
        d = self.spec.d_model
        masked = self._mix_visits() + self.n_slots - self.sources_per_token()
        return float(4 * d * masked + 6 * d * self.spec.depth)

    def _mix_visits(self) -> int:
        """Slots the ``2L`` sublayer mixes visit on the XLA path: all ``M`` each
        under ``layer_scan = "carries"``; the depth-linear stack's reads see the
        bank cut to their position group's extent (``bank_extent``)."""
        if self.spec.layer_scan != "depth_linear":
            return 2 * self.spec.depth * self.n_slots
        return sum(2 * e["bank"] for e in read_extents(self.spec.depth, self.bank_extent))

    def state_floats_per_token(self) -> int:
        """The bank and each slot's inverse RMS: ``M (d + 1)`` (full: ``M = 2L + 1``;
        block: ``M = 1 + ceil(2L/S)``).  With ``model.impl=pallas`` the kernels
        recompute the RMS and the state is the bank's ``M d``."""
        return self.n_slots * (self.spec.d_model + 1)

    def describe(self) -> dict:
        return {**super().describe(), "blocks": list(self.blocks), "sources": self.n_slots}

    # ------------------------------------------------------------ the original's format
    # AttnResTransformerBlock (block.py@6bdf2ad), attnres_block_size S sublayers per
    # block (1: full); before the original registered the block type, a default
    # block carrying attnres_block_size.  Its extra norms are built without an eps:
    # OLMo-core's RMSNorm default, 1e-5 (attnres_eps).
    original_blocks = ("attnres",)
    original_fields = {"attnres_block_size": (None,)}

    @classmethod
    def _original_size(cls, block) -> int | None:
        name, size = block.get("name") or "default", block.get("attnres_block_size")
        if name == "attnres":
            return 1 if size is None else size
        return size if name == "default" else None

    @classmethod
    def original_claims(cls, block):
        size = cls._original_size(block)
        return size is not None and (size == 1) == (cls.name == "attnres_full")

    @classmethod
    def from_original(cls, block, saved, options):
        size = block.int("attnres_block_size", default=1)
        residual = {"attnres_eps": 1e-5}
        if size > 1:
            residual.update(attnres_block_size=size, attnres_partition="size")
        return Reading(block="attnres", residual=residual)

    def to_original(self):
        if float(self.cfg.attnres_eps) != 1e-5 or self.blocks != block_sizes(
                self.spec.depth, 1, self._original_block_size, "size"):
            raise ConfigError(f"the original's AttnRes has eps 1e-5 and blocks of a fixed size; "
                              f"this {self.name} has eps {self.cfg.attnres_eps:g} and blocks "
                              f"{describe_blocks(self.blocks)}")
        return {"name": "attnres", "attnres_block_size": self._original_block_size}

    @property
    def _original_block_size(self) -> int:
        return self.blocks[0]

    def original_block_tensors(self, i):
        """``attn_res_proj``, ``attn_res_norm`` (not on block 0: the first sublayer
        reads the embedding alone), ``mlp_res_proj``, ``mlp_res_norm``."""
        d = self.spec.d_model
        out: list = []
        for sub, side in ((0, "attn"), (1, "mlp")):
            if i == 0 and sub == 0:
                out += [Constant("blocks/residual/query", (0, 0), 0.0),
                        Constant("blocks/residual/key_norm", (0, 0), 1.0)]
                continue
            out += [_query(f"{side}_res_proj.weight", d, "blocks/residual/query", (i, sub)),
                    vector(f"{side}_res_norm.weight", (d,), "blocks/residual/key_norm", (i, sub))]
        return out

    def original_global_tensors(self):
        d = self.spec.d_model
        return [_query("res_proj.weight", d, "residual/query"),
                vector("res_norm.weight", (d,), "residual/key_norm")]


def _query(key: str, d: int, leaf: str, index: tuple = ()) -> Tensor:
    """A pseudo-query: the original's ``Linear(d, 1)`` weight ``[1, d]``."""
    return Tensor(key, (1, d), (Place(leaf, index, lambda w: w[0], lambda x: x[None]),))


@dataclasses.dataclass(frozen=True)
class AttnResBlockConfig(AttnResConfig, Variants):
    attnres_blocks: int = 8  # N: blocks over the 2L sublayers
    attnres_block_size: int = 0  # S: sublayers per block; 0 = from attnres_blocks
    attnres_partition: str = "size"  # "size": blocks of S, ceil(2L/N) if 0 | "count": N blocks

    variants = {"n_blocks": {"attnres_partition": "count"}}
    saved_before = {**AttnResConfig.saved_before, "attnres_partition": "count"}

    def validate(self, config) -> None:
        super().validate(config)
        check_number("attnres_blocks", self.attnres_blocks, 1, integer=True,
                     meaning="blocks over 2L sublayers")
        check_number("attnres_block_size", self.attnres_block_size, 0, integer=True,
                     meaning="sublayers per block; 0 = from attnres_blocks")
        check_choice("attnres_partition", self.attnres_partition, PARTITIONS)


@dataclasses.dataclass(frozen=True)
class AttnResBlock(AttnResFull):
    name = "attnres_block"
    description = (
        "Block Attention Residuals: sublayer outputs summed in blocks of S; each "
        "sublayer mixes over the embedding, the committed blocks and the partial"
    )
    reference = "Kimi Team 2026, Attention Residuals (arXiv 2603.15031), Block AttnRes"
    Config = AttnResBlockConfig

    @property
    def blocks(self) -> tuple[int, ...]:
        return block_sizes(self.spec.depth, int(self.cfg.attnres_blocks),
                           int(self.cfg.attnres_block_size), str(self.cfg.attnres_partition))

    def layout(self) -> str:
        return describe_blocks(self.blocks)
