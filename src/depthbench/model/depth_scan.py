"""The layer stack with memory linear in depth for states holding depth banks.

Under ``nn.scan`` (with or without remat) the backward pass keeps every
block's input carry.  For a family whose state holds a *bank* with one slot
per source (attnres's source bank, moda's depth-KV cache: ``O(L)`` slots of
``B x T x ...``) that is ``O(L^2)`` memory.  But a block writes only a few
slots of a bank, and leaves the others bitwise unchanged, so the carry
before block ``i`` is the carry after it with those slots put back::

    state_i[bank] = state_{i+1}[bank] with slots(i) := undo_i

where ``undo_i`` holds the values the slots had before block ``i``
(attnres_block's running partial for a slot still being summed); a family
whose block writes only *fresh* slots (still zero: attnres_full, moda) says
so, and nothing is kept for them.  :func:`layer_stack` is a ``jax.custom_vjp`` over the whole
stack that

* forward: scans the blocks once, keeping per block only ``undo_i`` and the
  state's small leaves (everything that is not a bank: the ``d``-wide
  stream, counters, masks), plus the final state: ``O(L)`` in all;
* backward: scans the blocks in reverse carrying the banks and one
  cotangent state, rebuilds each block's input carry from the one after
  it, and recomputes the block's forward inside ``jax.vjp`` (what
  ``nn.remat`` does) to pull the cotangent through it.

The rebuild is exact (slots are restored, not recomputed), so the
gradients are those of the plain scan up to the summation order XLA picks
inside one block.  The family says which leaves are banks and which slots
a block may write through ``ResidualFamily.bank_slots``; a slot listed that
the block does not write (a skipped block, a repeated slot) is restored to
the value it already has, which is harmless.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

# (params of one block, state, per-block scan inputs, global params) -> (state, z)
Step = Callable[[Any, dict, dict, Any], tuple[dict, Any]]
# (state, execution position) -> {bank leaf: (slot axis, slots [k] the block may write)}
Slots = Callable[[dict, jax.Array], dict[str, tuple[int, jax.Array]]]


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _entry(item):
    """``(leaf, (axis, slots[, fresh]))`` -> ``(leaf, (axis, slots, fresh))``."""
    key, value = item
    return key, (*value, False)[:3]


def _take(bank, axis: int, slots):
    return jnp.take(bank, slots, axis=axis, mode="clip")  # past the end: restored nowhere


def _put(bank, axis: int, slots, values):
    """``bank`` with ``bank[..., slots, ...] = values`` along ``axis`` (None: zeros)."""
    moved = jnp.moveaxis(bank, axis, 0)
    values = 0 if values is None else jnp.moveaxis(values, axis, 0)
    restored = moved.at[slots].set(values, mode="drop")  # a slot past the end: none
    return jnp.moveaxis(restored, 0, axis)


def layer_stack(
    step: Step, bank_slots: Slots, params_l, state0: dict, xs_l: dict, g, *, unroll: int = 1
):
    """Run ``step`` over the stacked ``params_l`` / ``xs_l`` (leading axis L) from
    ``state0``; returns ``(final_state, zs)`` with ``zs`` stacked over blocks.

    ``state0`` is a dict; ``bank_slots(state, pos)`` names its bank leaves and
    may read only the state's *other* leaves (in the backward pass the banks
    it sees are those after the block).  ``xs_l["pos"]`` is each block's
    execution position.  Integer and boolean leaves of the state get no
    cotangent, as under plain autodiff.  ``unroll`` is ``jax.lax.scan``'s, for
    all three scans (``model.scan_unroll``: the same program, unrolled)."""
    bank_keys = tuple(bank_slots(state0, xs_l["pos"][0]))

    def run(params_l, state0, xs_l, g):
        def body(state, px):
            return step(px[0], state, px[1], g)

        return jax.lax.scan(body, state0, (params_l, xs_l), unroll=unroll)

    def fwd(params_l, state0, xs_l, g):
        def body(state, px):
            p, x = px
            slots = bank_slots(state, x["pos"])
            undo = {k: None if fresh else _take(state[k], ax, idx)
                    for k, (ax, idx, fresh) in map(_entry, slots.items())}
            small = {k: v for k, v in state.items() if k not in bank_keys}
            new, z = step(p, state, x, g)
            return new, (z, undo, small)

        final, (zs, undo_l, small_l) = jax.lax.scan(
            body, state0, (params_l, xs_l), unroll=unroll
        )
        return (final, zs), (params_l, xs_l, g, {k: final[k] for k in bank_keys}, undo_l, small_l)

    def bwd(res, cts):
        params_l, xs_l, g, banks_final, undo_l, small_l = res
        ct_final, ct_zs = cts
        float_keys = tuple(k for k in ct_final if _is_float(banks_final.get(k, small_l.get(k))))

        def body(carry, inp):
            banks_next, ct_state, ct_g = carry
            p, x, undo, small, ct_z = inp
            slots = bank_slots({**small, **banks_next}, x["pos"])
            banks = {k: _put(banks_next[k], ax, idx, undo[k])
                     for k, (ax, idx, _) in map(_entry, slots.items())}
            state = {**small, **banks}
            fixed = {k: v for k, v in state.items() if k not in float_keys}

            def block(p, diff, g):
                new, z = step(p, {**fixed, **diff}, x, g)
                return {k: new[k] for k in float_keys}, z

            _, pull = jax.vjp(block, p, {k: state[k] for k in float_keys}, g)
            ct_p, ct_diff, ct_g_i = pull((ct_state, ct_z))
            ct_g = jax.tree.map(jnp.add, ct_g, ct_g_i)
            return (banks, ct_diff, ct_g), ct_p

        ct_state = {k: ct_final[k] for k in float_keys}
        carry = (banks_final, ct_state, jax.tree.map(jnp.zeros_like, g))
        (_, ct_diff0, ct_g), ct_params = jax.lax.scan(
            body, carry, (params_l, xs_l, undo_l, small_l, ct_zs), reverse=True, unroll=unroll
        )
        ct_state0 = {k: ct_diff0.get(k) for k in ct_final}
        return ct_params, ct_state0, None, ct_g

    stack = jax.custom_vjp(run)
    stack.defvjp(fwd, bwd)
    return stack(params_l, state0, xs_l, g)
