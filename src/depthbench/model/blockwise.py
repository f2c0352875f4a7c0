"""The model run block by block, for what replaces or differentiates one block
(usefulness, the block Jacobian, the backward layer statistics), which
``Transformer``'s one ``nn.scan`` cannot cut into.  Same parameters, the
backbone's own ``Block``; the state only through the family's probes
(docs/spec/analysis.md, "How depthbench computes them")."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from depthbench.model.layers import RMSNorm
from depthbench.model.residual.protocol.capabilities import probes
from depthbench.model.transformer import Block


class Blockwise:
    """Pure functions of ``(params, tokens_bt, ...)`` for one run (anything with its
    ``spec`` and ``family``: a ``Run``, a ``TrainSetup``; trace them under its
    ``context()``)."""

    def __init__(self, run):
        self.run, self.spec, self.fam = run, run.spec, run.family
        self.probes = probes(run.family)
        self.block = Block(run.spec, run.family)
        self.norm = RMSNorm(run.spec)

    def _globals(self, params):
        return params.get("residual", {})

    def init_state(self, params, tokens_bt):
        x0 = jnp.take(params["embed"], tokens_bt, axis=0).astype(self.spec.dtype)
        return self.fam.init_state(self._globals(params), x0)

    def block_params(self, params, pos):
        """All of the block's parameters at ``pos`` (what ``Block`` takes)."""
        return jax.tree.map(lambda a: a[pos], params["blocks"])

    def family_params(self, params, pos):
        """The family's per-block tree at ``pos`` (the protocol's ``p``)."""
        return jax.tree.map(lambda a: a[pos], params["blocks"].get("residual", {}))

    def run_block(self, params, state, pos, positions_t, segments_bt=None):
        """The block at ``pos`` (``positions_t``: ``[T]``, or ``[B, T]`` with a packed
        row's ``segments_bt``)."""
        xs = {"pos": pos, "ident": pos, "active": jnp.ones((), bool)}
        p = self.block_params(params, pos)
        out, _ = self.block.apply({"params": p}, state, xs, self._globals(params), positions_t,
                                  None, segments_bt)
        return out

    def next_boundary(self, params, state, pos):
        """``z`` after the block at ``pos``: read with the next block's
        parameters, or the readout's after the last block."""
        g, last = self._globals(params), self.spec.depth - 1
        nxt = self.family_params(params, jnp.minimum(pos + 1, last))
        return jax.lax.cond(pos >= last,
                            lambda: self.probes.boundary_state(None, g, state),
                            lambda: self.probes.boundary_state(nxt, g, state))

    def logits(self, params, state):
        g = self._globals(params)
        x = self.fam.readout(g, state, lambda h, eps=None: self.norm.apply(
            {"params": params["final_norm"]}, h, eps))
        return jnp.einsum("btd,dv->btv", x.astype(self.spec.dtype),
                          params["head"].astype(self.spec.dtype)).astype(jnp.float32)

    def forward(self, params, tokens_bt, sub_pos=-1, w_dd=None, b_d=None):
        """Logits with the block at ``sub_pos`` (traced; -1: none) replaced by
        ``z -> z @ w + b``."""
        positions_t = jnp.arange(tokens_bt.shape[1], dtype=jnp.int32)
        g = self._globals(params)

        def body(state, pos):
            if w_dd is None:
                return self.run_block(params, state, pos, positions_t), None

            def substitute(st):
                z = self.probes.boundary_state(self.family_params(params, pos), g, st)
                z_hat = jnp.einsum("btd,de->bte", z.astype(jnp.float32), w_dd) + b_d
                return self.probes.with_boundary_state(st, z_hat)

            return jax.lax.cond(pos == sub_pos, substitute,
                                lambda st: self.run_block(params, st, pos, positions_t),
                                state), None

        state, _ = jax.lax.scan(body, self.init_state(params, tokens_bt),
                                jnp.arange(self.spec.depth, dtype=jnp.int32))
        return self.logits(params, state)

    def entry_states(self, params, tokens_bt):
        """The full residual state at every block's entry: leaves ``[L, ...]``."""
        positions_t = jnp.arange(tokens_bt.shape[1], dtype=jnp.int32)

        def body(state, pos):
            return self.run_block(params, state, pos, positions_t), state

        _, states = jax.lax.scan(body, self.init_state(params, tokens_bt),
                                 jnp.arange(self.spec.depth, dtype=jnp.int32))
        return states

    def block_jacobian_rows(self, params, state, pos, tokens_bt, rows_kd):
        """Rows ``e_i^T J`` of the position-averaged block Jacobian
        ``J[i, j] = mean_{b,t} sum_{t'} d z_{l+1}[b, t', i] / d z_l[b, t, j]``
        (the cotangent ``e_i`` at every output position, as the original's
        VJP does), for the unit rows ``rows_kd`` ``[K, D]``; ``state`` is the
        full state at the block's entry."""
        positions_t = jnp.arange(tokens_bt.shape[1], dtype=jnp.int32)
        g = self._globals(params)
        z_in = self.probes.boundary_state(self.family_params(params, pos), g, state)

        def f(z):
            st = self.probes.with_boundary_state(state, z)
            out = self.run_block(params, st, pos, positions_t)
            return self.next_boundary(params, out, pos).astype(jnp.float32)

        z32 = z_in.astype(jnp.float32)
        _, vjp = jax.vjp(f, z32)

        def row(e_d):
            (grad_btd,) = vjp(jnp.broadcast_to(e_d, z32.shape))
            return jnp.mean(grad_btd, axis=(0, 1))

        return jax.vmap(row)(rows_kd)
