"""The LLaMA-style decoder with a pluggable residual family.

Blocks run under ``nn.scan`` over stacked parameters, so compile time does not
grow with depth; each step carries its position, identity and ``active`` flag,
which is how analyses skip and permute blocks.  Nothing here knows which
family runs: its protocol (``residual/protocol/base.py``) does the residual work."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
from flax import linen as nn

from depthbench.model import decode
from depthbench.model.depth_scan import layer_stack
from depthbench.model.layers import MLP, Attention, RMSNorm, project, trunc_normal
from depthbench.model.past_attention import KVCache, PastKeys
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.base import (
    BTD,
    KEEP,
    ResidualFamily,
    Site,
    keep_for_backward,
    norm_param,
    rms_norm,
)
from depthbench.model.residual.protocol.capabilities import (
    AnalysisProbes,
    DepthAttention,
    DepthBanks,
    PositionState,
    PreNormEps,
    ScaledInput,
    probes,
)
from depthbench.model.spec import ModelSpec

# What a forward can capture beside its logits (Transformer's docstring): the
# depth analyses' captures, and what a decoder keeps (model/decode.py).
CAPTURES = ("z", "lens_logits", "probe")
DECODE_CAPTURES = ("kv", "carry")

# Parameter names the optimizer's weight-decay presets need (train/optim.py):
# the scope holding every residual-family parameter, the backbone's norm gains
# (pre-norms and the final norm's weight), the input embedding.
FAMILY_SCOPE = "residual"
NORM_PARAMS = ("attn_norm", "mlp_norm", "scale")
EMBEDDING_PARAMS = ("embed",)


def family_of(spec: ModelSpec) -> ResidualFamily:
    """The residual family ``spec`` names (its fields completed with the defaults)."""
    return registry.build(spec)


class _FamilyParams(nn.Module):
    """A scope in which a family creates its parameters."""

    fam: ResidualFamily
    per_block: bool

    @nn.compact
    def __call__(self, ident=None):
        if self.per_block:
            return self.fam.create_block_params(self, ident)
        return self.fam.create_global_params(self)


class Block(nn.Module):
    """One transformer block: attention then MLP, each wrapped by the family."""

    spec: ModelSpec
    fam: ResidualFamily
    capture: bool | str = False
    keep_kv: bool = False  # return the attention's rotated keys and values (a decoder's cache)

    @nn.compact
    def __call__(self, state, xs, g, positions, valid_bs=None, segments=None):
        fam, s = self.fam, self.spec
        pos, ident, active = xs["pos"], xs["ident"], xs["active"]
        # A decode step: this layer's cached keys of the positions each row holds.
        past = PastKeys(*xs["past"], valid_bs) if "past" in xs else None
        p = _FamilyParams(fam, True, name="residual")(ident)
        attn = Attention(s, tuple(fam.init_scale(m) for m in "qkvo"), name="attn")
        mlp = MLP(s, tuple(fam.init_scale(m) for m in ("gate", "up", "down")), name="mlp")
        norms = [
            norm_param(self, f"{k}_norm", s.d_model, s.pdtype) if fam.pre_norm else None
            for k in ("attn", "mlp")
        ]
        captured, analysis = {}, probes(fam)
        if self.capture:
            captured["z"] = analysis.boundary_state(p, g, state)
        if self.capture == "all":
            captured["lens"] = analysis.lens_state(p, g, state)
            captured["probe"] = []
        for sub in (0, 1):
            site = Site(sub, pos, ident)
            if self.capture == "all":
                captured["probe"].append(analysis.probe(p, state, site))
            h, ctx = fam.read(p, state, site)
            if all(h is not leaf for leaf in jax.tree.leaves(state)):
                h = keep_for_backward(h)  # a family's mix of its state (see _keep_state)
            eps = fam.pre_norm_eps(site) if isinstance(fam, PreNormEps) else s.norm_eps
            x_in = rms_norm(h, norms[sub], eps) if fam.pre_norm else h
            if isinstance(fam, ScaledInput):
                x_in = fam.input_scale(p, x_in, site)
            if sub == 0:
                attend = fam.attention(p, state, site) if isinstance(fam, DepthAttention) else None
                y, keys = attn(x_in, positions, attend, past, segments)
                aux = {"x_in": x_in, "kv": (keys.k, keys.v), "ctx": ctx}
                if self.keep_kv:
                    captured["kv"] = {"k": keys.k_rot, "v": keys.v}
            else:
                y, aux = mlp(x_in), {"x_in": x_in, "ctx": ctx}
            state = fam.write(p, state, y, site, aux, active)
            if sub == 0:
                state = _keep_state(fam, state, pos)
        if self.capture == "all":
            captured["probe"] = jax.tree.map(lambda a, b: jnp.stack([a, b]), *captured["probe"])
        return state, captured or None


# depthbench's own policy.  ``matmuls_saveable`` keeps every matmul output
# without batch dimensions (the projections, the MLP, the families' routing
# products) and every value marked ``keep_for_backward``: attention's output
# and log-sum-exp, mhc's Sinkhorn iterates, each block's state between its
# sublayers and a family's read of it (Block).  The backward recomputes the
# elementwise work between them (norms, RoPE, activations, routing weights),
# which XLA fuses into the gradient's own loops, so no matmul runs twice and
# the layer scan stacks a few activations per block instead of a dozen.
# Train step on a 2-core CPU against remat off: bench/results/peer.md.
OWN_POLICIES = {
    "matmuls_saveable": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names(KEEP)),
}


def _keep_state(fam: ResidualFamily, state, pos):
    """The state between a block's sublayers, marked ``keep_for_backward``
    except its banks (they would be kept once more per block).

    Under ``matmuls_saveable`` the backward would otherwise recompute the
    attention sublayer's write, and the family's read from it, to reach the
    MLP: for the stream families a pass over ``n`` activations each, which
    kept it slower than remat off (bench/results/code_notes.md, "the state
    between a block's sublayers")."""
    if not isinstance(state, dict):  # banks are leaves of a dict state
        return keep_for_backward(state)
    banks = fam.bank_slots(state, pos) if isinstance(fam, DepthBanks) else {}
    return {k: v if k in banks else keep_for_backward(v) for k, v in state.items()}


def remat_policy_names() -> tuple[str, ...]:
    """``"none"``, depthbench's ``matmuls_saveable`` and the policies of
    ``jax.checkpoint_policies`` that need no arguments (``nothing_saveable``,
    ``dots_saveable`` ...), as the config names them."""
    found = sorted(n for n in dir(jax.checkpoint_policies)
                   if n.endswith("_saveable") or n.startswith("checkpoint_"))
    return ("none", *OWN_POLICIES, *found)


def remat_policy(name: str):
    """The rematerialisation policy called ``name``: depthbench's own, or looked
    up in ``jax.checkpoint_policies`` by name (big_vision style), so every
    policy JAX has is available without a list here."""
    return OWN_POLICIES.get(name) or getattr(jax.checkpoint_policies, name)


def _asked(capture: Sequence[str]) -> tuple[str, ...]:
    asked = tuple(capture)
    if not set(asked) <= set(CAPTURES + DECODE_CAPTURES):
        raise ValueError(f"capture: {asked}; each must be one of {CAPTURES + DECODE_CAPTURES}")
    return asked


def _level(asked: tuple[str, ...]) -> bool | str:
    """What the blocks record: nothing, the depth states, or everything."""
    return "all" if {"lens_logits", "probe"} & set(asked) else "z" in asked


def _lm_head(head_dv, x_btd):
    logits = project(x_btd.astype(head_dv.dtype), head_dv)
    return nn.with_logical_constraint(
        logits.astype(jnp.float32), ("activation_batch", "activation_length", "activation_vocab"))


def _depth_outputs(fam, g, state, captured, level, final_norm, lm_head) -> dict:
    """The depth analyses' captures from what the blocks recorded: ``z`` (the
    ``L + 1`` boundary states), and at level "all" ``lens_logits`` and ``probe``."""
    analysis = probes(fam)
    z_last = analysis.boundary_state(None, g, state)
    out = {"z": jnp.concatenate([captured["z"], z_last[None]], axis=0)}
    if level == "all":
        depth = captured["z"].shape[0]
        lens = [jax.tree.map(lambda a, i=i: a[i], captured["lens"]) for i in range(depth)]
        lens.append(analysis.lens_state(None, g, state))
        out["lens_logits"] = jnp.stack([lm_head(analysis.lens_decode(g, r, final_norm))
                                        for r in lens])
        out["probe"] = captured["probe"]
    return out


class Transformer(nn.Module):
    """tokens [B, T] -> ``(logits [B, T, V] fp32, captured)``, always.

    ``captured`` holds what ``capture`` asked for (:data:`CAPTURES`, and
    :data:`DECODE_CAPTURES` below), nothing
    else: ``"z"``, the ``L + 1`` depth states stacked on axis 0 (``z_0``
    first; ``z_l`` taken at block ``l``'s left boundary with its parameters,
    see ``AnalysisProbes.boundary_state``); ``"lens_logits"`` ``[L+1, B, T,
    V]`` (fp32, the logit lens at every boundary); ``"probe"`` (the family's
    :meth:`probe` of every sublayer, leaves ``[L, 2, ...]``).  ``active``
    [L] (bool) skips blocks; ``ident`` [L] gives the original index of the
    block at each position (use with :func:`permute_blocks`).

    Decoding (``model/decode.py``): ``"kv"`` captures each layer's rotated keys
    and values ``{"k", "v": [L, B, T, K, H]}``; with ``cache``
    (:class:`~depthbench.model.past_attention.KVCache`) the tokens are the next
    ones of each row, at positions ``lengths_b + 0 .. T-1``, and see the
    cached positions as well (the family resumes from the cache's carry,
    ``capabilities.PositionState``); ``"carry"`` captures what the family
    carries to later positions.  ``logits_at`` [B]: the logits (and the
    carry) at that position of each row only, ``[B, V]``.

    Packed rows (fine-tuning, several documents per row): ``segments`` [B, T]
    names each token's document (attention never crosses documents) and
    ``positions`` [B, T] its position within it (RoPE's), so each document
    computes as it would alone in a row of its own.
    """

    spec: ModelSpec

    @property
    def family(self) -> ResidualFamily:
        """The residual family of this model (one instance per spec: ``registry.build``)."""
        return family_of(self.spec)

    @nn.compact
    def __call__(self, tokens_bt, *, capture: Sequence[str] = (), active=None, ident=None,
                 cache: KVCache | None = None, logits_at=None, segments=None, positions=None):
        s, fam, asked = self.spec, self.family, _asked(capture)
        chex.assert_rank(tokens_bt, 2)  # [B, T] token ids (static: checked at trace time)
        embed = self.param("embed", nn.with_logical_partitioning(
            trunc_normal(s.init_std), ("vocab", "embed")), (s.vocab_size, s.d_model), s.pdtype)
        x0 = nn.with_logical_constraint(jnp.take(embed, tokens_bt, axis=0).astype(s.dtype), BTD)
        g = _FamilyParams(fam, False, name="residual")()
        state = fam.init_state(g, x0)
        if positions is None:
            positions = jnp.arange(tokens_bt.shape[1], dtype=jnp.int32)
        xs = {"pos": jnp.arange(s.depth, dtype=jnp.int32),
              "ident": jnp.arange(s.depth, dtype=jnp.int32) if ident is None
              else jnp.asarray(ident, jnp.int32),
              "active": jnp.ones((s.depth,), bool) if active is None
              else jnp.asarray(active, bool)}
        # A decode step continues each row where the cache stands (model/decode.py).
        state, positions, valid_bs = decode.resume(fam, g, state, cache, positions, xs)
        if segments is not None and (cache is not None or isinstance(fam, PositionState)):
            raise ValueError("segments: packed rows need a family that carries nothing "
                             "across positions, and no cache")
        state, inner = self._blocks(fam, _level(asked), "kv" in asked, state, xs, g, positions,
                                    valid_bs, segments, decoding=cache is not None)
        final_norm = RMSNorm(s, name="final_norm")
        head = self.param("head", nn.with_logical_partitioning(
            trunc_normal(s.init_std), ("embed", "vocab")), (s.d_model, s.vocab_size), s.pdtype)
        lm_head = functools.partial(_lm_head, head.astype(s.dtype))
        x = fam.readout(g, state, final_norm)
        chex.assert_shape(x, (*tokens_bt.shape, s.d_model))  # a family's readout is [B, T, d]
        if logits_at is None:
            logits = lm_head(x)
        else:  # the head on one position per row (a prefill's last token)
            logits = lm_head(jnp.take_along_axis(x, logits_at[:, None, None], axis=1))[:, 0]
        inner = inner or {}
        out = {"kv": inner.get("kv")}
        if "carry" in asked:
            out["carry"] = decode.carry(fam, g, state, tokens_bt.shape, logits_at)
        if _level(asked):
            out.update(_depth_outputs(fam, g, state, inner, _level(asked), final_norm, lm_head))
        return logits, {name: out[name] for name in asked}

    def _blocks(self, fam, level, keep_kv, state, xs, g, positions, valid_bs, segments,
                decoding: bool):
        """The layer stack: ``(state, what the blocks captured)``.  The depth-linear
        stack is for the backward's memory; initialisation and decoding take the
        plain scan."""
        s = self.spec
        if (self._depth_linear(fam, state) and not self.is_initializing()
                and not decoding and not keep_kv):
            return self._depth_linear_stack(fam, level, state, xs, g, positions, segments)
        block = Block
        if s.remat_policy != "none":
            block = nn.remat(Block, policy=remat_policy(s.remat_policy), prevent_cse=False)
        stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast),
                        length=s.depth, unroll=s.scan_unroll,
                        metadata_params={nn.PARTITION_NAME: "layers"})
        return stack(s, fam, level, keep_kv, name="blocks")(state, xs, g, positions, valid_bs,
                                                             segments)

    def _depth_linear(self, fam: ResidualFamily, state) -> bool:
        """Whether the stack runs through :func:`depth_scan.layer_stack`: the
        state has banks and ``model.layer_scan`` asks for it."""
        return (self.spec.layer_scan == "depth_linear" and isinstance(fam, DepthBanks)
                and bool(fam.bank_slots(state, jnp.zeros((), jnp.int32))))

    def _depth_linear_stack(self, fam, capture, state, xs, g, positions, segments=None):
        """The blocks' stacked parameters (made by the ``nn.scan`` at init) run
        by the depth-linear custom VJP, each block applied as a pure function."""
        params_l = nn.meta.unbox(self.variables["params"]["blocks"])

        def step(p, state, x, g):
            block = Block(self.spec, fam, capture)
            return block.apply({"params": p}, state, x, g, positions, None, segments)

        return layer_stack(step, fam.bank_slots, params_l, state, xs, g,
                           unroll=self.spec.scan_unroll, extent=fam.bank_extent)


def params_init(model: Transformer, seq_len: int):
    """``key -> boxed parameters``: ``model.init`` on one row of ``seq_len`` token
    zeros, jitted (inlined where a jitted program calls it).

    A Flax ``init`` traces the whole forward.  jax caches the trace of a jitted
    function, so ``jax.eval_shape`` of this one (the shapes and logical names a
    set-up needs) and an init program that calls it trace the model once, where
    two lambdas over ``model.init`` traced it twice (0.06-0.25 s a model at d 64,
    L 4).  The program is the same, and so are the parameters, bit for bit."""
    return jax.jit(lambda key: model.init(key, jnp.zeros((1, seq_len), jnp.int32))["params"],
                   inline=True)


def permute_blocks(fam: ResidualFamily, params, order):
    """Params with the stacked blocks reordered: position i runs block ``order[i]``
    with all of its weights, and whatever else the family moves with a block
    (``AnalysisProbes.permute_boundaries``: attnres's right-boundary mix).

    Pass ``ident=order`` to the model as well, so each block keeps its identity
    (and with it anything tied to its original index, e.g. lns's scale)."""
    order = jnp.asarray(order, jnp.int32)
    moved = dict(params)
    moved["blocks"] = jax.tree.map(lambda a: jnp.take(a, order, axis=0), params["blocks"])
    if isinstance(fam, AnalysisProbes):
        moved = fam.permute_boundaries(params, moved, order)
    return moved


def cross_entropy(logits_btv, targets_bt, mask_bt=None):
    """Mean next-token cross entropy in fp32 (optionally masked):
    ``nll = logsumexp(logits) - logits[target]``.

    The target logit is picked by a compare against an iota inside a sum
    rather than ``take_along_axis``: XLA fuses the compare into the reduction
    and its gradient into an elementwise select, where a gather's gradient is
    a scatter over [B, T, V] (slow on CPU); no one-hot is materialised."""
    logits = logits_btv.astype(jnp.float32)
    lse_bt = jax.nn.logsumexp(logits, axis=-1)
    vocab_v = jnp.arange(logits.shape[-1], dtype=targets_bt.dtype)
    target_bt = jnp.sum(jnp.where(vocab_v == targets_bt[..., None], logits, 0.0), axis=-1)
    nll = lse_bt - target_bt
    if mask_bt is None:
        return jnp.mean(nll)
    mask = mask_bt.astype(jnp.float32)
    return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)
