"""mhc: manifold-constrained hyper-connections (DeepSeek, 2025), ``n = 4``, no tanh.

For sublayer ``j`` with ``k = j mod n`` (spec/residuals.md, family 7), in
DeepSeek's fused form (one ``nd x (n^2 + 2n)`` matrix ``phi``, the RMS
division applied after the matmul)::

    f    = concat_s H[s]                    r = rms(f)        (fp32)
    u    = (f @ phi) / r                    = [u_pre | u_post | u_res]
    pre  = sigmoid(a_pre * u_pre + b_pre)                      in R^n
    post = 2 * sigmoid(a_post * u_post + b_post)               in R^n
    R    = a_res * reshape(u_res, (n, n)) + B_res
    P    = sinkhorn(R)        (sinkhorn_iters, sinkhorn_temperature)
    read:  x = sum_s pre[s] * H[s];  y = F(N(x))
    write: H[t] <- sum_s P[s, t] * H[s] + post[t] * y

``phi`` is stored as ``[n, d, n^2 + 2n]`` (the same matrix, rows split by
stream so its ``d`` axis shards like the streams' feature axis).  Init:
``phi = 0``; ``a_* = hc_scale_init`` (0.01); ``b_pre = +mhc_bias`` at ``k``,
``-mhc_bias`` elsewhere; ``b_post = 0``; ``B_res`` 0 on the diagonal and
``-mhc_bias`` off it, so ``P`` starts near the identity.  ``b_pre``,
``b_post`` and ``B_res`` take no weight decay.  Two connectors per block,
stacked on a leading axis of size 2; all coefficient maths in fp32.  As in
hc, ``write`` recomputes ``read``'s coefficients (one copy after XLA's CSE).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from depthbench.model.residual import fused
from depthbench.model.residual.base import family_param, gate, with_axes
from depthbench.model.residual.fields import check_number
from depthbench.model.residual.sinkhorn import sinkhorn, sinkhorn_flops
from depthbench.model.residual.streams import (
    NBTD,
    StreamConfig,
    StreamFamily,
    add_weighted,
    mix_streams,
    stream_sum,
)


def mhc_bias_init(ident, n: int, bias: float):
    """``b_pre`` of both connectors of block ``ident``: ``[2, n]``, ``+bias`` at ``k``."""

    def init(key, shape, dtype=jnp.float32):
        k_c = (2 * jnp.asarray(ident, jnp.int32) + jnp.arange(2)) % n
        at_k = jnp.arange(n)[None, :] == k_c[:, None]
        return jnp.where(at_k, bias, -bias).astype(dtype)

    return init


def mhc_res_init(n: int, bias: float):
    """``B_res`` ``[2, n, n]``: 0 on the diagonal, ``-bias`` off it."""

    def init(key, shape, dtype=jnp.float32):
        return jnp.broadcast_to(jnp.where(jnp.eye(n, dtype=bool), 0.0, -bias), shape).astype(dtype)

    return init


@dataclasses.dataclass(frozen=True)
class MHCConfig(StreamConfig):
    sinkhorn_iters: int = 20
    sinkhorn_temperature: float = 1.0
    mhc_bias: float = 8.0  # |b_pre| and -B_res off-diagonal at init

    def validate(self, config) -> None:
        super().validate(config)
        check_number("sinkhorn_iters", self.sinkhorn_iters, 1, integer=True)
        check_number("sinkhorn_temperature", self.sinkhorn_temperature, 0.0, exclusive=True)
        check_number("mhc_bias", self.mhc_bias, 0.0,
                     meaning="|b_pre| and -B_res off-diagonal at init")


@dataclasses.dataclass(frozen=True)
class MHC(StreamFamily):
    name = "mhc"
    description = (
        "manifold-constrained hyper-connections: sigmoid read/write gates and a "
        "Sinkhorn (doubly-stochastic) stream mix"
    )
    reference = "Xie et al. (DeepSeek-AI) 2025, mHC: Manifold-Constrained Hyper-Connections"
    no_decay = frozenset({"b_pre", "b_post", "B_res"})
    Config = MHCConfig

    @property
    def width(self) -> int:
        """Columns of ``phi``: ``n`` (pre) + ``n`` (post) + ``n^2`` (res)."""
        return self.n * self.n + 2 * self.n

    # ------------------------------------------------------------ parameters
    def create_block_params(self, mod, ident):
        n, d = self.n, self.spec.d_model
        s0 = float(self.cfg.hc_scale_init)
        bias = float(self.cfg.mhc_bias)

        gate_init = nn.initializers.constant(s0)
        return {
            "phi": family_param(
                mod,
                "phi",
                nn.initializers.zeros,
                (2, n, d, self.width),
                (None, "streams", "embed", "routing"),
            ),
            "a_pre": family_param(mod, "a_pre", gate_init, (2,), (None,)),
            "a_post": family_param(mod, "a_post", gate_init, (2,), (None,)),
            "a_res": family_param(mod, "a_res", gate_init, (2,), (None,)),
            "b_pre": family_param(
                mod, "b_pre", mhc_bias_init(ident, n, bias), (2, n), (None, "streams")
            ),
            "b_post": family_param(mod, "b_post", nn.initializers.zeros, (2, n), (None, "streams")),
            # Logical names must be distinct: the target-stream axis is unnamed.
            "B_res": family_param(
                mod, "B_res", mhc_res_init(n, bias), (2, n, n), (None, "streams", None)
            ),
        }

    # ------------------------------------------------------------ routing
    def coefficients(self, p, h_nbtd, sub: int):
        """``pre`` ``[n, B, T]``, ``post`` ``[n, B, T]``, ``P`` ``[n, B, T, n]`` (fp32)."""
        n = self.n
        h32 = h_nbtd.astype(jnp.float32)
        # rms over the n*d concatenation = sqrt(mean over streams and features).
        # (over the streams as a chain: see stream_sum)
        ms_bt = stream_sum(jnp.mean(jnp.square(h32), axis=-1)) / n
        inv_r_bt = jax.lax.rsqrt(ms_bt + self.spec.norm_eps)
        u = jnp.einsum("sbtd,sdm->btm", h32, p["phi"][sub].astype(jnp.float32))
        u = u * inv_r_bt[..., None]
        pre = jax.nn.sigmoid(p["a_pre"][sub] * u[..., :n] + p["b_pre"][sub])
        post = 2.0 * jax.nn.sigmoid(p["a_post"][sub] * u[..., n : 2 * n] + p["b_post"][sub])
        r_btst = p["a_res"][sub] * u[..., 2 * n :].reshape(*u.shape[:-1], n, n) + p["B_res"][sub]
        p_btst = sinkhorn(
            r_btst, int(self.cfg.sinkhorn_iters), float(self.cfg.sinkhorn_temperature)
        )
        return (jnp.moveaxis(pre, -1, 0), jnp.moveaxis(post, -1, 0), jnp.moveaxis(p_btst, -2, 0))

    def _fused_pre(self, p, state, sub: int):
        iters, temp = int(self.cfg.sinkhorn_iters), float(self.cfg.sinkhorn_temperature)
        return fused.mhc_pre(p, sub, state, iters, temp, self.spec.norm_eps)

    def read(self, p, state, site):
        if fused.use_pallas(self.spec):
            return self._fused_pre(p, state, site.sub)[0], {}
        pre, _, _ = self.coefficients(p, state, site.sub)
        return mix_streams(pre[..., None], state)[0].astype(state.dtype), {}

    def write(self, p, state, y, site, aux, active):
        if fused.use_pallas(self.spec):
            _, mix, post = self._fused_pre(p, state, site.sub)
            return gate(active, with_axes(fused.stream_post(state, mix, post, y), NBTD), state)
        _, post, p_sbtt = self.coefficients(p, state, site.sub)
        new = add_weighted(mix_streams(p_sbtt, state), post, y)
        return gate(active, with_axes(new.astype(state.dtype), NBTD), state)

    def probe(self, p, state, site):
        """The residual mixing ``P[s, t]`` (``H[t] <- sum_s P[s, t] H[s]``),
        token-averaged: ``mixing`` ``[n, n]``."""
        _, _, p_sbtt = self.coefficients(p, state, site.sub)
        return {"mixing": jnp.mean(p_sbtt, axis=(1, 2))}

    # ------------------------------------------------------------ costs
    def connector_params(self) -> int:
        """``nd(n^2 + 2n)`` (``phi``) + ``n^2`` (``B_res``) + ``2n`` (``b_pre``, ``b_post``)
        + 3 gates (``a_pre``, ``a_post``, ``a_res``)."""
        n, d = self.n, self.spec.d_model
        return n * d * self.width + n * n + 2 * n + 3

    def extra_block_params(self) -> int:
        """Two connectors per block (attention and MLP)."""
        return 2 * self.connector_params()

    def extra_flops_per_token(self, seq_len: int) -> float:
        """Per connector (2L of them), counting multiply-adds as 2:

        * ``2 n d (n^2 + 2n)``: the fused projection ``f @ phi``;
        * ``sinkhorn_flops(n, iters)``: ``6 n^2`` per iteration (see ``sinkhorn``);
        * ``2 n d``: the read ``sum_s pre[s] H[s]``;
        * ``2 n^2 d``: the stream mix ``sum_s P[s, t] H[s]``;
        * ``2 n d``: the write ``post[t] * y`` into ``n`` streams.

        The RMS of ``f`` (``2 n d``) is a norm and left out, as in ``costs``."""
        n, d = self.n, self.spec.d_model
        iters = int(self.cfg.sinkhorn_iters)
        per = 2 * n * d * self.width + sinkhorn_flops(n, iters) + 2 * n * d + 2 * n * n * d
        per += 2 * n * d
        return float(2 * self.spec.depth * per)

    def describe(self) -> dict:
        return {
            **super().describe(),
            "sinkhorn_iters": int(self.cfg.sinkhorn_iters),
            "mhc_bias": float(self.cfg.mhc_bias),
        }
