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
so, and nothing is kept for them.  A family whose block moreover *sets*
its slots and masks the slots not yet written (moda: ``overwrite``) needs
no rebuild at all: the backward runs each block on the final bank.
:func:`layer_stack` is a ``jax.custom_vjp`` over the whole stack that

* forward: scans the blocks once, keeping per block only ``undo_i`` and the
  state's small leaves (everything that is not a bank: the ``d``-wide
  stream, counters, masks), plus the final state: ``O(L)`` in all;
* backward: scans the blocks in reverse carrying the banks (those not
  ``overwrite``) and one cotangent state, rebuilds each block's input carry
  from the one after it, and recomputes the block's forward inside
  ``jax.vjp`` (what ``nn.remat`` does) to pull the cotangent through it.

The rebuild is exact (slots are restored, not recomputed), so the
gradients are those of the plain scan up to the summation order XLA picks
inside one block.  The family says which leaves are banks and which slots
a block may write through ``DepthBanks.bank_slots`` (a ``BankSlots`` per
bank); a slot listed that the block does not write (a skipped block, a
repeated slot) is restored to the value it already has, which is harmless.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from depthbench.model.residual.protocol.capabilities import BankSlots

# (params of one block, state, per-block scan inputs, global params) -> (state, z)
Step = Callable[[Any, dict, dict, Any], tuple[dict, Any]]
# (state, execution position) -> {bank leaf: the slots the block may write}
Slots = Callable[[dict, jax.Array], dict[str, BankSlots]]
# positions p (static) -> {bank leaf: slots [0, n) the blocks at positions [0, p) may touch}
Extent = Callable[[int], dict[str, int]]


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _take(bank, axis: int, slots):
    return jnp.take(bank, slots, axis=axis, mode="clip")  # past the end: restored nowhere


def _put(bank, axis: int, slots, values):
    """``bank`` with ``bank[..., slots, ...] = values`` along ``axis`` (None: zeros).
    Indexed in place (one index array, so the slot axis stays where it is):
    moving the axis to the front made two bank-sized transposes per block
    where it is not already there."""
    at = (slice(None),) * axis + (slots,)
    return bank.at[at].set(0 if values is None else values, mode="drop")  # past the end: none


# Position groups of a banked stack (``position_groups``).  More groups mix
# fewer invalid slots ((G + 1) / 2G of the whole banks' visits) and run each
# block on a smaller bank, but compile one scan each and hold more cut
# copies.  8 gave attnres_full's and moda's fastest CPU step at L 32, with
# temp memory still well below what more groups hold
# (bench/results/depth_memory.md, "Fourth pass").
GROUPS = 8
# ... but no fewer than ``MIN_SPAN`` positions per group by default: each
# group's cut copies cost memory, and a short stack has little to gain (one
# block per group multiplied a short stack's temp memory:
# bench/results/code_notes.md).
MIN_SPAN = 4


def read_extents(depth: int, extent: Extent) -> list[dict[str, int]]:
    """For each execution position, the banks' slots its reads see under
    :func:`layer_stack` with ``extent``: the extent at its group's end."""
    return [extent(end) for start, end in position_groups(depth) for _ in range(start, end)]


def position_groups(depth: int, groups: int | None = None) -> tuple[tuple[int, int], ...]:
    """``groups`` contiguous spans ``[start, end)`` of near-equal length covering
    the ``depth`` execution positions (fewer when ``depth < groups``); the
    longer spans come first.  By default ``GROUPS``, or fewer so that each
    span has at least ``MIN_SPAN`` positions."""
    if groups is None:
        groups = min(GROUPS, int(depth) // MIN_SPAN)
    n = max(1, min(int(groups), int(depth)))
    q, r = divmod(int(depth), n)
    ends = [0]
    for i in range(n):
        ends.append(ends[-1] + q + (i < r))
    return tuple(zip(ends[:-1], ends[1:], strict=True))


def _cut(tree, start: int, end: int):
    return jax.tree.map(lambda a: a[start:end], tree)


def _join(parts):
    if len(parts) == 1:
        return parts[0]
    return jax.tree.map(lambda *a: jnp.concatenate(a, axis=0), *parts)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The static layout of one banked stack: its bank leaves and their slot
    axes, full slot counts, position groups and each group's bank sizes, and
    the banks the backward never carries (``overwrite``)."""

    entries: dict[str, BankSlots]  # of the first block (for the static fields)
    full: dict[str, int]
    spans: tuple[tuple[int, int], ...]
    sizes: tuple[dict[str, int], ...]  # per group: {bank leaf: slots its scan carries}

    @property
    def axes(self) -> dict[str, int]:
        return {k: e.axis for k, e in self.entries.items()}

    @property
    def fixed(self) -> frozenset[str]:
        return frozenset(k for k, e in self.entries.items() if e.overwrite)


def _plan(bank_slots: Slots, state0: dict, pos_l, extent: Extent | None) -> _Plan:
    depth = int(pos_l.shape[0])
    entries = bank_slots(state0, pos_l[0])
    full = {k: state0[k].shape[e.axis] for k, e in entries.items()}
    spans, sizes = [], []
    for start, end in position_groups(depth) if extent is not None else ((0, depth),):
        bound = extent(end) if extent is not None else {}
        size = {k: min(int(bound.get(k, full[k])), full[k]) for k in entries}
        if sizes and sizes[-1] == size:  # a group cut like the one before: one scan
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
            sizes.append(size)
    return _Plan(entries, full, tuple(spans), tuple(sizes))


def _resize(plan: _Plan, state: dict, state0: dict, size: dict[str, int]) -> dict:
    """``state`` with each bank cut or grown to ``size`` slots; grown slots come
    from ``state0`` (no block before this group touched them)."""
    out = dict(state)
    for k, n in size.items():
        ax = plan.axes[k]
        cur = state[k].shape[ax]
        if n < cur:
            out[k] = jax.lax.slice_in_dim(state[k], 0, n, axis=ax)
        elif n > cur:
            base = jax.lax.slice_in_dim(state0[k], 0, n, axis=ax)
            out[k] = jax.lax.dynamic_update_slice_in_dim(base, state[k], 0, axis=ax)
    return out


def _block_params(params_l, i):
    """Block ``i``'s parameters, indexed in the stacked ones inside a loop."""
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False),
                        params_l)


def _scan_groups(plan: _Plan, body, params_l, state0: dict, xs_l: dict, unroll: int):
    """``body`` scanned over each position group in turn, on the banks cut to the
    group's size: the final state (banks at full size) and each group's outputs.
    With several groups each block's parameters are indexed in the whole stack
    (cut per group, the parameters' slices were copies: moda's temp memory at
    d 64, L 32 grew by the parameters' size)."""
    state, outs = state0, []
    grouped = len(plan.spans) > 1

    def indexed(state, ix):
        i, x = ix
        return body(state, (_block_params(params_l, i), x))

    for (start, end), size in zip(plan.spans, plan.sizes, strict=True):
        xs = ((jnp.arange(start, end), _cut(xs_l, start, end)) if grouped
              else (_cut(params_l, start, end), _cut(xs_l, start, end)))
        state, out = jax.lax.scan(indexed if grouped else body,
                                  _resize(plan, state, state0, size), xs, unroll=unroll)
        outs.append(out)
    return _resize(plan, state, state0, plan.full), outs


def _forward(plan: _Plan, step: Step, bank_slots: Slots, params_l, state0, xs_l, g, unroll):
    """The stack's forward for the backward: per block only the undo values of
    the slots it may write (none for fresh ones) and the state's small leaves."""

    def body(state, px):
        p, x = px
        undo = {k: None if e.fresh else _take(state[k], e.axis, e.slots)
                for k, e in bank_slots(state, x["pos"]).items()}
        small = {k: v for k, v in state.items() if k not in plan.entries}
        new, z = step(p, state, x, g)
        return new, (z, undo, small)

    final, outs = _scan_groups(plan, body, params_l, state0, xs_l, unroll)
    zs = _join([z for z, _, _ in outs])
    saved = [(undo_l, small_l) for _, undo_l, small_l in outs]
    return (final, zs), (params_l, xs_l, g, {k: final[k] for k in plan.entries}, saved)


def _backward_block(step: Step, bank_slots: Slots, banks_final, float_keys, fixed, axes,
                    carry, inp, size):
    """One block of the reverse scan: its input carry rebuilt from the one after
    it (the undo values put back), then its forward recomputed inside
    ``jax.vjp`` to pull the cotangent through it."""
    banks_next, ct_state, ct_g = carry
    p, x, undo, small, ct_z, g = inp
    # Sliced here, per block (a transient copy), not once per group: the
    # groups' slices, all computed up front, would each hold a bank (once per
    # group behind an optimization barrier was tried and raised moda's temp
    # memory by half: bench/results/depth_memory.md, "Fourth pass").
    fixed_banks = {k: jax.lax.slice_in_dim(banks_final[k], 0, size[k], axis=axes[k])
                   for k in fixed}
    slots = bank_slots({**small, **banks_next, **fixed_banks}, x["pos"])
    banks = {k: _put(banks_next[k], e.axis, e.slots, undo[k])
             for k, e in slots.items() if k in banks_next}
    state = {**small, **fixed_banks, **banks}
    consts = {k: v for k, v in state.items() if k not in float_keys}

    def block(p, diff, g):
        new, z = step(p, {**consts, **diff}, x, g)
        return {k: new[k] for k in float_keys}, z

    _, pull = jax.vjp(block, p, {k: state[k] for k in float_keys}, g)
    ct_p, ct_diff, ct_g_i = pull((ct_state, ct_z))
    ct_g = jax.tree.map(jnp.add, ct_g, ct_g_i)
    return (banks, ct_diff, ct_g), ct_p


def _backward(plan: _Plan, step: Step, bank_slots: Slots, unroll: int, res, cts):
    """The reverse scan over the groups, last first, each carrying the banks (those
    not ``overwrite``) and one cotangent state cut to the group's size."""
    params_l, xs_l, g, banks_final, saved = res
    ct_final, ct_zs = cts
    small0 = saved[0][1]
    float_keys = tuple(k for k in ct_final if _is_float(banks_final.get(k, small0.get(k))))
    # Overwritten banks: each block runs on the final bank as it is (the
    # slots it would see still empty hold later values, which its reads
    # weigh 0, and it sets its own slots), so they are no loop carry: no
    # per-block restore, and none of the bank copies XLA makes around an
    # in-place update of a loop carry.
    fixed, axes = plan.fixed, plan.axes

    def body(carry, inp, size):
        p, x, undo, small, ct_z = inp
        return _backward_block(step, bank_slots, banks_final, float_keys, fixed, axes, carry,
                               (p, x, undo, small, ct_z, g), size)

    # Several groups: each block's parameters indexed in the whole stack and its
    # parameter cotangent put into one stacked carry, in place (per group, the
    # parameters' slices and the groups' stacked cotangents joined at the end
    # held the parameters' size twice more).
    grouped = len(plan.spans) > 1

    def indexed(carry, inp, size):
        carry, ct_pl = carry
        i, x, undo, small, ct_z = inp
        carry, ct_p = body(carry, (_block_params(params_l, i), x, undo, small, ct_z), size)
        ct_pl = jax.tree.map(
            lambda a, u: jax.lax.dynamic_update_index_in_dim(a, u.astype(a.dtype), i, 0),
            ct_pl, ct_p)
        return (carry, ct_pl), None

    # Each group runs on the banks and their cotangents cut to its extent:
    # the cotangent of the slots past it passes the group unchanged (kept
    # aside in ``tails``).
    banks = {k: v for k, v in banks_final.items() if k not in fixed}
    ct_state = {k: ct_final[k] for k in float_keys}
    tails = {k: [] for k in plan.entries}
    ct_g = jax.tree.map(jnp.zeros_like, g)
    ct_params = []
    ct_pl = jax.tree.map(jnp.zeros_like, params_l) if grouped else None
    for (start, end), size, (undo_l, small_l) in reversed(
            list(zip(plan.spans, plan.sizes, saved, strict=True))):
        for k, n in size.items():
            ax = axes[k]
            if k in ct_state and ct_state[k].shape[ax] > n:
                tails[k].insert(0, jax.lax.slice_in_dim(ct_state[k], n, None, axis=ax))
                ct_state[k] = jax.lax.slice_in_dim(ct_state[k], 0, n, axis=ax)
            if k in banks:
                banks[k] = jax.lax.slice_in_dim(banks[k], 0, n, axis=ax)
        rest = (_cut(xs_l, start, end), undo_l, small_l, _cut(ct_zs, start, end))
        if grouped:
            ((banks, ct_state, ct_g), ct_pl), _ = jax.lax.scan(
                functools.partial(indexed, size=size), ((banks, ct_state, ct_g), ct_pl),
                (jnp.arange(start, end), *rest), reverse=True, unroll=unroll)
            continue
        (banks, ct_state, ct_g), ct_p = jax.lax.scan(
            functools.partial(body, size=size), (banks, ct_state, ct_g),
            (_cut(params_l, start, end), *rest), reverse=True, unroll=unroll)
        ct_params.insert(0, ct_p)
    for k, rest in tails.items():
        if rest and k in ct_state:
            ct_state[k] = jnp.concatenate([ct_state[k], *rest], axis=axes[k])
    ct_state0 = {k: ct_state.get(k) for k in ct_final}
    return (ct_pl if grouped else _join(ct_params)), ct_state0, None, ct_g


def layer_stack(
    step: Step, bank_slots: Slots, params_l, state0: dict, xs_l: dict, g, *, unroll: int = 1,
    extent: Extent | None = None,
):
    """Run ``step`` over the stacked ``params_l`` / ``xs_l`` (leading axis L) from
    ``state0``; returns ``(final_state, zs)`` with ``zs`` stacked over blocks.

    ``state0`` is a dict; ``bank_slots(state, pos)`` names its bank leaves and
    may read only the state's *other* leaves (in the backward pass the banks
    it sees are those after the block).  ``xs_l["pos"]`` is each block's
    execution position.  Integer and boolean leaves of the state get no
    cotangent, as under plain autodiff.  ``unroll`` is ``jax.lax.scan``'s, for
    all the scans (``model.scan_unroll``: the same program, unrolled).

    ``extent(p)`` (optional, static ints) bounds the slots the blocks at
    positions ``[0, p)`` read or write: ``{bank leaf: n}``, the first ``n``
    slots.  With it the positions run in :func:`position_groups`, one scan
    per group, each on the banks (and, backwards, their cotangents) cut to
    the extent at the group's end: the slots past it are neither read nor
    written by the group, so they wait outside its scan (a copy of the cut
    banks per group, none per block).  A mix or a depth attention then never
    visits a slot that cannot be valid yet by the end of its group: about
    ``(G + 1) / 2G`` of the slot visits of whole banks."""
    plan = _plan(bank_slots, state0, xs_l["pos"], extent)

    def run(params_l, state0, xs_l, g):
        def body(state, px):
            return step(px[0], state, px[1], g)

        final, zs = _scan_groups(plan, body, params_l, state0, xs_l, unroll)
        return final, _join(zs)

    stack = jax.custom_vjp(run)
    stack.defvjp(functools.partial(_forward, plan, step, bank_slots, unroll=unroll),
                 functools.partial(_backward, plan, step, bank_slots, unroll))
    return stack(params_l, state0, xs_l, g)
