"""attnres_full and attnres_block: Attention Residuals (Kimi, 2026).

Each sublayer's input is a softmax-weighted mix over depth *sources*
(spec/residuals.md, families 8 and 9)::

    logit_i = sum_d q[d] * w[d] * v_i[d] / rms(v_i)    (no 1/sqrt(d))
    p       = softmax_i(logit)                          (fp32)
    h       = sum_i p_i * v_i                           (values raw)
    y_j     = F_j(N_j(h))                               (the usual pre-norm stays)

with a pseudo-query ``q`` (init 0) and key-norm weight ``w`` (init 1) per
sublayer, and one more ``q``, ``w`` pair for the readout mix that feeds
``N_out``.  Zero queries make every mix the uniform average of its sources.

Both variants keep one fixed-size bank ``[M, B, T, d]`` (logical axis
'activation_sources') and a count ``c`` of the sublayers executed so far.
The ``2L`` sublayers are cut into consecutive blocks (:func:`block_sizes`);
``block_of[c]`` is the block of sublayer ``c``.  Sublayer output ``y_c`` is
*added* into slot ``1 + block_of[c]``, and the mix before sublayer ``c``
sees slots ``0 .. started[c]``, where ``started[c]`` is the number of blocks
holding at least one of the sublayers ``0 .. c-1`` (``started[0] = 0``):

* slot 0 holds ``x0``; slot ``1 + b`` holds the sum of block ``b``'s outputs,
  the running partial while block ``b`` is open, the committed block once
  it is complete; the embedding is never summed into a partial;
* before the first sublayer of a block the previous block is complete, so
  the mix covers ``x0`` and the committed blocks; otherwise also the
  partial of the current block: exactly the spec's commit-then-mix rule;
* the first sublayer sees only ``x0`` and reads it exactly (softmax over
  one source);
* blocks of one sublayer are **attnres_full**: every output is its own
  source, ``M = 2L + 1``.  **attnres_block** with ``attnres_block_size = S
  > 0`` uses blocks of ``S`` (the last keeps the remainder); with
  ``attnres_block_size = 0`` it uses exactly ``N = attnres_blocks`` blocks
  whenever ``2L >= N``, sizes ``floor(2L / N)`` or one more, the **first**
  ``2L mod N`` blocks taking the extra sublayer (the original benchmark's
  ``ceil(2L / N)`` also made the early blocks the larger ones, but gave
  fewer than ``N`` blocks at e.g. L14, L17, L21 with ``N = 8``); with
  ``2L < N`` every sublayer is its own block.  ``M = 1 + number of blocks``.

A skipped block (``active`` false) adds nothing to its slot and does not
advance ``c``: it adds no source, and the following blocks fill the bank in
*execution* order, exactly as if the block had been removed.  Each write
touches one slot (a scatter-add into it), never the whole bank.  The
per-sublayer ``q``, ``w`` are block parameters, so they move with a permuted
block; every block owns both pairs (the block that runs first does not use
its attention pair: its mix has one source).

Depth states (``capture=True``) and the logit lens follow the original
benchmark (docs/spec/analysis.md): ``z_l`` is the raw mix block ``l``'s
attention side computes with its own ``q``, ``w`` (the backbone captures it
at the block's entry, with the block's parameters), and ``z_L`` the
readout's mix.  Analyses (never training) may also skip a block: its
next consumer's mix then returns the newest source ("next-output" rule,
tracked by the state's ``skipped`` flag), and a swap moves the mix that
produces each block's right boundary with it.  The analysis options
``probe_rule="readout"``, ``skip_rule="remove"`` and ``swap_rule="block"``
(in ``spec.residual``) select depthbench's earlier definitions instead.

:func:`depth_mix` is pure ``jnp`` with an explicit source mask: the fused
kernel in ``pallas_kernels`` replaces it one for one.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import linen as nn

from depthbench.model.depth_scan import read_extents
from depthbench.model.residual import fused
from depthbench.model.residual.base import BTD, ResidualFamily, family_param, norm_param, with_axes
from depthbench.model.residual.fields import check_number

MBTD = ("activation_sources", *BTD)


def depth_weights(
    bank_mbtd: jax.Array, valid_m: jax.Array, query_d: jax.Array, key_norm_d: jax.Array, eps: float
) -> jax.Array:
    """The softmax weights ``p`` ``[M, B, T]`` (fp32) of a depth mix; invalid slots get 0."""
    v32 = bank_mbtd.astype(jnp.float32)
    qw_d = query_d.astype(jnp.float32) * key_norm_d.astype(jnp.float32)
    inv_rms_mbt = jax.lax.rsqrt(jnp.mean(jnp.square(v32), axis=-1) + eps)
    logits_mbt = jnp.einsum("mbtd,d->mbt", v32, qw_d) * inv_rms_mbt
    logits_mbt = jnp.where(valid_m[:, None, None], logits_mbt, -jnp.inf)
    return jax.nn.softmax(logits_mbt, axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def depth_mix(
    bank_mbtd: jax.Array, valid_m: jax.Array, query_d: jax.Array, key_norm_d: jax.Array, eps: float
) -> jax.Array:
    """Softmax-over-depth mix of the valid sources, in fp32; ``[B, T, d]`` in the
    bank's dtype.  Invalid slots get zero weight; slot 0 must be valid.

    Differentiated by hand (:func:`_depth_mix_bwd`): autodiff's backward of
    the expression above makes several bank-sized temporaries and passes;
    this one reads the bank three times and writes one bank-sized cotangent."""
    return _depth_mix_fwd(bank_mbtd, valid_m, query_d, key_norm_d, eps)[0]


def _depth_mix_fwd(bank_mbtd, valid_m, query_d, key_norm_d, eps):
    v32 = bank_mbtd.astype(jnp.float32)
    qw_d = query_d.astype(jnp.float32) * key_norm_d.astype(jnp.float32)
    # No dot batched over (b, t) (``einsum("mbt,mbtd->btd")``): XLA:CPU lowers
    # it with a transposed copy of the bank.  A sum over the slot axis instead.
    inv_rms_mbt = jax.lax.rsqrt(jnp.mean(jnp.square(v32), axis=-1) + eps)
    dot_mbt = jnp.sum(v32 * qw_d, axis=-1)
    logits_mbt = jnp.where(valid_m[:, None, None], dot_mbt * inv_rms_mbt, -jnp.inf)
    # The barrier keeps XLA from fusing the softmax into the sum over slots
    # (recomputing it for each of the d features).
    p_mbt = jax.lax.optimization_barrier(jax.nn.softmax(logits_mbt, axis=0))
    h_btd = jnp.sum(p_mbt[..., None] * v32, axis=0).astype(bank_mbtd.dtype)
    return h_btd, (bank_mbtd, query_d, key_norm_d, inv_rms_mbt, dot_mbt, p_mbt)


def _depth_mix_bwd(eps, res, dh_btd):
    """With ``s = v . (q w)``, ``r = rsqrt(mean(v^2) + eps)``, logit ``l = s r``:
    ``dp_m = dh . v_m``, ``dl = p (dp - sum_m p dp)`` (softmax; 0 on invalid
    slots since ``p`` is), ``dv_m = p_m dh + dl_m r_m (q w) - dl_m s_m r_m^3 v_m / d``
    and ``d(q w) = sum dl r v``."""
    bank_mbtd, query_d, key_norm_d, inv_rms_mbt, dot_mbt, p_mbt = res
    v32 = bank_mbtd.astype(jnp.float32)
    qw_d = query_d.astype(jnp.float32) * key_norm_d.astype(jnp.float32)
    dh = dh_btd.astype(jnp.float32)
    m, b, t, d = v32.shape
    dp_mbt = jnp.sum((v32.reshape(m, -1) * dh.reshape(1, -1)).reshape(m, b, t, d), axis=-1)
    dl_mbt = p_mbt * (dp_mbt - jnp.sum(p_mbt * dp_mbt, axis=0))
    a_mbt = dl_mbt * inv_rms_mbt
    c_mbt = a_mbt * dot_mbt * jnp.square(inv_rms_mbt) / d
    p_mbt, a_mbt, c_mbt = jax.lax.optimization_barrier((p_mbt, a_mbt, c_mbt))  # as in forward
    dv = p_mbt[..., None] * dh + a_mbt[..., None] * qw_d - c_mbt[..., None] * v32
    dqw_d = jnp.sum(a_mbt[..., None] * v32, axis=(0, 1, 2))
    return (dv.astype(bank_mbtd.dtype), None,
            (dqw_d * key_norm_d.astype(jnp.float32)).astype(query_d.dtype),
            (dqw_d * query_d.astype(jnp.float32)).astype(key_norm_d.dtype))


depth_mix.defvjp(_depth_mix_fwd, _depth_mix_bwd)


def block_sizes(depth: int, blocks: int, block_size: int = 0) -> tuple[int, ...]:
    """Sublayers per block over the ``2L`` sublayers, in order.

    ``block_size > 0``: blocks of ``block_size``, the last keeps the remainder.
    Otherwise exactly ``blocks`` blocks when ``2L >= blocks``: ``q = 2L // blocks``
    sublayers each, the first ``2L mod blocks`` of them one more; and ``2L``
    blocks of one sublayer when ``2L < blocks``."""
    total = 2 * int(depth)
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
class AttnResFull(ResidualFamily):
    name = "attnres_full"
    description = (
        "Attention Residuals: each sublayer reads a softmax mix over the embedding "
        "and every earlier sublayer output"
    )
    reference = "Kimi Team 2026, Attention Residuals (arXiv 2603.15031)"
    sharding_rules = (("activation_sources", None),)  # the source bank's slot axis

    # ------------------------------------------------------------ layout
    @property
    def blocks(self) -> tuple[int, ...]:
        """Sublayers per block, in order (full: ``2L`` blocks of one)."""
        return (1,) * (2 * self.spec.depth)

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

    def _valid(self, count, bank) -> jax.Array:
        """Slots a mix sees after ``count`` executed sublayers: ``0 .. started[count]``
        (over the slots ``bank`` has: the layer stack may cut it, ``bank_extent``)."""
        started = jnp.asarray(self.started, jnp.int32)
        return jnp.arange(bank.shape[0]) <= started[count]

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
        empty = jnp.zeros((self.n_slots - 1, *x0.shape), x0.dtype)
        bank = with_axes(jnp.concatenate([x0[None], empty], axis=0), MBTD)
        # ``skipped`` (analyses only; 0 in training): 1 the last block was
        # skipped, 2 the newest source was injected (``with_boundary_state``).
        zero = jnp.zeros((), jnp.int32)
        return {"bank": bank, "count": zero, "skipped": zero}

    def _mix(self, state, query, key_norm):
        mix = fused.depth_mix if fused.use_pallas(self.spec) else depth_mix
        bank = state["bank"]
        return mix(bank, self._valid(state["count"], bank), query, key_norm, self.spec.norm_eps)

    def _newest(self, count) -> jax.Array:
        """The newest valid slot after ``count`` executed sublayers (0: ``x0``)."""
        return jnp.asarray(self.started, jnp.int32)[count]

    def _consumer_mix(self, state, query, key_norm):
        """A block boundary's mix (the next block's attention side, or the
        readout).  After a skipped block it is the identity on the newest
        source (the original benchmark's "next-output" rule), unless the
        analysis option ``skip_rule`` is "remove" (the mix runs as usual)."""
        mix = self._mix(state, query, key_norm)
        newest = jax.lax.dynamic_index_in_dim(
            state["bank"], self._newest(state["count"]), axis=0, keepdims=False)
        rule = self.analysis_option("skip_rule", "next_output") == "next_output"
        return jnp.where(state["skipped"] >= (1 if rule else 2), newest, mix)

    def read(self, p, state, site):
        if site.sub == 0:
            return self._consumer_mix(state, p["query"][0], p["key_norm"][0]), {}
        return self._mix(state, p["query"][site.sub], p["key_norm"][site.sub]), {}

    def write(self, p, state, y, site, aux, active):
        bank, count = state["bank"], state["count"]
        slot = 1 + jnp.asarray(self.block_of, jnp.int32)[jnp.minimum(count, len(self.block_of) - 1)]
        # An add into one slot (the slot is in range: ``bank_extent``; clamped as
        # a dynamic_update_slice would): its cotangent passes the bank's through
        # unchanged, where read-add-write makes a bank-sized select and add.
        slot = jnp.minimum(slot, bank.shape[0] - 1)
        add_btd = jnp.where(active, y.astype(bank.dtype), jnp.zeros(y.shape, bank.dtype))
        bank = bank.at[slot].add(add_btd, mode="promise_in_bounds")
        skipped = jnp.where(active, 0, 1) if site.sub == 1 else state["skipped"]
        return {"bank": with_axes(bank, MBTD), "count": count + active.astype(jnp.int32),
                "skipped": skipped}

    def bank_slots(self, state, pos):
        """The block adds into the slots of sublayers ``count`` and ``count + 1``."""
        block_of = jnp.asarray(self.block_of, jnp.int32)
        last = len(self.block_of) - 1
        count = state["count"]
        slots = 1 + block_of[jnp.minimum(jnp.stack([count, count + 1]), last)]
        # Blocks of one sublayer (full): both slots are still empty before the block.
        return {"bank": (0, slots, max(self.blocks) == 1)}

    def bank_extent(self, positions: int) -> dict[str, int]:
        """Blocks ``[0, p)`` run sublayers ``c < 2p``: they mix slots up to
        ``started[c]`` and add into ``1 + block_of[c] <= started[2p]``."""
        return {"bank": 1 + self.started[min(2 * int(positions), len(self.started) - 1)]}

    def readout(self, g, state, final_norm):
        return final_norm(self._consumer_mix(state, g["query"], g["key_norm"]))

    def depth_state(self, g, state):
        """The raw mix (before ``N_out``) under the readout's query (see module doc)."""
        return self._consumer_mix(state, g["query"], g["key_norm"])

    def lens_input(self, g, state):
        return self._consumer_mix(state, g["query"], g["key_norm"])

    # ------------------------------------------------------------ analysis probes
    def boundary_state(self, p, g, state):
        """``z_l``: the raw mix block ``l``'s attention side computes (its own
        query and key norm); after the last block, the readout's mix."""
        if p is None or self.analysis_option("probe_rule", "next_consumer") == "readout":
            return self.depth_state(g, state)
        return self._consumer_mix(state, p["query"][0], p["key_norm"][0])

    def with_boundary_state(self, state, z):
        """The newest source replaced by ``z`` and marked so that the next
        consumer's mix returns it (the "next-output" rule): the block that
        follows reads exactly ``z``, and later mixes see ``z`` in that slot."""
        bank = jax.lax.dynamic_update_index_in_dim(
            state["bank"], z.astype(state["bank"].dtype), self._newest(state["count"]), axis=0)
        return {**state, "bank": with_axes(bank, MBTD), "skipped": jnp.full((), 2, jnp.int32)}

    def lens_state(self, p, g, state):
        return self.boundary_state(p, g, state)

    def lens_decode(self, g, r, final_norm):
        return final_norm(r)

    def probe(self, p, state, site):
        """``depth_weights`` ``[M]``: the token-averaged softmax weight sublayer
        ``site`` puts on each bank slot (0: the embedding; unfilled slots 0)."""
        w = depth_weights(state["bank"], self._valid(state["count"], state["bank"]),
                          p["query"][site.sub], p["key_norm"][site.sub], self.spec.norm_eps)
        w_m = jnp.mean(w, axis=(1, 2))  # a cut bank (``bank_extent``): the rest are unfilled
        return {"depth_weights": jnp.pad(w_m, (0, self.n_slots - w_m.shape[0]))}

    def permute_params(self, params, order):
        """Each block takes along the mix that produces its *right* boundary
        (the next block's attention-side ``q``, ``w``; the readout's for the
        last block), as the original benchmark's swap does; the attention-side
        pair at position 0 (a mix over ``x0`` alone) stays."""
        original = params
        params = super().permute_params(params, order)
        if self.analysis_option("swap_rule", "right_boundary") != "right_boundary":
            return params
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
        """``6 d`` per source per mix: the key's sum of squares (its RMS), the
        logit ``v . (q * w)`` and the weighted sum, 2 FLOPs per element each;
        the softmax over sources is negligible."""
        return float(6 * self.spec.d_model * self.sources_per_token())

    def masked_flops_per_token(self, seq_len: int) -> float:
        """The XLA path mixes over the bank's slots at each of the ``2L`` sublayers
        (the first one too; all ``M`` or the group's extent, ``_mix_visits``) and
        masks the slots not yet valid: ``6 d`` for each of those ``visits + M -
        sources`` slot visits (the readout visits all ``M``).  Not model FLOPs."""
        return float(6 * self.spec.d_model * (self._mix_visits() + self.n_slots
                                               - self.sources_per_token()))

    def _mix_visits(self) -> int:
        """Slots the ``2L`` sublayer mixes visit on the XLA path: all ``M`` each
        under ``layer_scan = "carries"``; the depth-linear stack's reads see the
        bank cut to their position group's extent (``bank_extent``)."""
        if self.spec.layer_scan != "depth_linear":
            return 2 * self.spec.depth * self.n_slots
        return sum(2 * e["bank"] for e in read_extents(self.spec.depth, self.bank_extent))

    def state_floats_per_token(self) -> int:
        """The bank: ``M * d`` (full: ``(2L + 1) d``; block: ``(1 + ceil(2L/S)) d``)."""
        return self.n_slots * self.spec.d_model

    def describe(self) -> dict:
        return {**super().describe(), "blocks": list(self.blocks), "sources": self.n_slots}


@dataclasses.dataclass(frozen=True)
class AttnResBlock(AttnResFull):
    name = "attnres_block"
    description = (
        "Block Attention Residuals: sublayer outputs summed in N blocks; each "
        "sublayer mixes over the embedding, the committed blocks and the partial"
    )
    reference = "Kimi Team 2026, Attention Residuals (arXiv 2603.15031), Block AttnRes"
    fields = {
        "attnres_blocks": 8,  # blocks over the 2L sublayers
        "attnres_block_size": 0,  # sublayers per block; 0 = from attnres_blocks
    }

    @classmethod
    def validate(cls, config) -> None:
        check_number(config, "attnres_blocks", 1, integer=True, meaning="blocks over 2L sublayers")
        check_number(
            config,
            "attnres_block_size",
            0,
            integer=True,
            meaning="sublayers per block; 0 = exactly attnres_blocks blocks",
        )

    @property
    def blocks(self) -> tuple[int, ...]:
        return block_sizes(
            self.spec.depth,
            int(self.spec.r("attnres_blocks")),
            int(self.spec.r("attnres_block_size")),
        )

    def layout(self) -> str:
        return describe_blocks(self.blocks)
