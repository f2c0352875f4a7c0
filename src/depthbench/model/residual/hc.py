"""hc: dynamic hyper-connections (Zhu et al. 2025), tanh on, ``n = 4`` streams.

For sublayer ``j`` with ``k = j mod n`` (spec/residuals.md, family 6)::

    hn[s]    = H[s] / rms(H[s])                         (eps 1e-8, no weight)
    A[s, :]  = A0[s, :] + s_a * tanh(hn[s] @ W_a)       W_a: d x (n+1)
    beta[s]  = beta0[s] + s_b * tanh(hn[s] . w_b)       w_b: d
    mixed[t] = sum_s A[s, t] * H[s]                     t = 0 .. n
    read:  x = mixed[0];  y = F(N(x))
    write: H[t] <- mixed[t + 1] + beta[t] * y          (hc_write = "mixed")
           H[t] <- H[t] + beta[t] * y                  (hc_write = "residual")

``A0[s, 0] = [s == k]``, ``A0[:, 1:] = I``, ``beta0 = 1``; ``W_a = w_b = 0``
and ``s_a = s_b = hc_scale_init`` (0.01).  ``A0`` and ``beta0`` are learned
(the paper's static connections) but take no weight decay.  ``k`` comes from
the block's identity, so a permuted block keeps the connection it was
initialised (and trained) with.  ``hc_tanh = False`` drops the tanh.

The original benchmark trained two forms of hc, and each is a set of fields
(docs/ORIGINAL.md has the history):

* **final** (the defaults): the ``mixed`` write rule
  (``pretrain/OLMo-core/src/olmo_core/nn/hyper_connections.py@8cc2fd74`` and
  ``@f61f873``, the HC paper's) with the ``sum_then_norm`` readout
  (``nn/transformer/model.py@8cc2fd74``, ``@d15e34b``);
* **early** (variant ``hc+early``): the
  ``residual`` rule, the branch output added to the unmixed streams, the
  mixing only forming the sublayer's input (``hyper_connections.py@dc75a4e``
  to ``@5152cab``), with the ``norm_then_sum`` readout (``model.py@dc75a4e`` to
  ``@5152cab``).  ``import-olmo`` tells them apart from the checkpoint's
  ``config.json`` (``formats/olmo/config.py``).

Each block has two connectors (attention, MLP), stacked on a leading axis
of size 2.  All coefficient maths is fp32.  ``read`` computes the
coefficients and hands them to ``write`` in its ``ctx``
(``streams.coefficients``; a write called without them computes its own).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from depthbench.errors import ConfigError
from depthbench.model.residual.parts import fused
from depthbench.model.residual.parts.streams import (
    CONNECTORS,
    NBTD,
    StreamConfig,
    StreamFamily,
    add_weighted,
    coefficients,
    hyper_block,
    mix_streams,
    read_hyper_connections,
)
from depthbench.model.residual.protocol.base import family_param, gate, with_axes
from depthbench.model.residual.protocol.family_config import check_choice
from depthbench.model.residual.protocol.original_format import Reading, vector

HC_EPS = 1e-8  # the stream norm's eps (spec: 1e-8, no weight)


def hc_static_init(ident, n: int):
    """``A0`` of both connectors of block ``ident``: ``[2, n, n+1]`` (ident may be traced)."""

    def init(key, shape, dtype=jnp.float32):
        k_c = (2 * jnp.asarray(ident, jnp.int32) + jnp.arange(2)) % n  # k of each connector
        first_cs = jnp.arange(n)[None, :] == k_c[:, None]
        eye_css = jnp.broadcast_to(jnp.eye(n, dtype=bool), (2, n, n))
        return jnp.concatenate([first_cs[..., None], eye_css], axis=-1).astype(dtype)

    return init


WRITES = ("mixed", "residual")


@dataclasses.dataclass(frozen=True)
class HCConfig(StreamConfig):
    hc_tanh: bool = True  # tanh on the dynamic parts
    hc_write: str = "mixed"  # "mixed": H <- mixed[1:] + beta y | "residual": H <- H + beta y

    variants = {**StreamConfig.variants,
                "early": {"hc_write": "residual", "readout": "norm_then_sum"}}
    # Run directories saved before ``readout`` existed read out norm-then-sum.
    saved_before = {"readout": "norm_then_sum"}

    def validate(self, config) -> None:
        super().validate(config)
        check_choice("hc_write", self.hc_write, WRITES)


@dataclasses.dataclass(frozen=True)
class HC(StreamFamily):
    name = "hc"
    description = (
        "dynamic hyper-connections: n streams mixed by A0 + s_a tanh(hn W_a), "
        "written with beta0 + s_b tanh(hn w_b)"
    )
    reference = "Zhu et al. 2025, Hyper-Connections (ICLR 2025, arXiv 2409.19606)"
    no_decay = frozenset({"A0", "beta0"})
    Config = HCConfig
    original_blocks = ("hc",)  # HCTransformerBlock (block.py@6bdf2ad)
    original_kinds = ("hc",)

    # ------------------------------------------------------------ the original's format
    @classmethod
    def from_original(cls, block, saved, options):
        _, _, form, f = read_hyper_connections(block, cls.original_kinds, options)
        early = form.value == "early"
        return Reading(block="hc", choice=form, residual={
            "hc_n": f["hc_n"], "hc_scale_init": f["hc_scale_init"], "readout": f["readout"],
            "hc_tanh": f["tanh"], "hc_write": "residual" if early else "mixed"})

    def to_original(self):
        forms = {("mixed", "sum_then_norm"): False, ("residual", "norm_then_sum"): True}
        early = forms.get((self.cfg.hc_write, self.readout_mode))
        if early is None:
            raise ConfigError(f"the original's hc wrote and read out as mixed/sum_then_norm or "
                              f"residual/norm_then_sum; this hc is {self.cfg.hc_write}/"
                              f"{self.readout_mode}")
        hyper = {"kind": "hc", "num_residual_streams": self.n, "collapse": "auto",
                 "gating_factor_init": float(self.cfg.hc_scale_init)}
        if early or not self.cfg.hc_tanh:  # (its early config saved tanh, a bool then)
            hyper["tanh"] = bool(self.cfg.hc_tanh)
        return hyper_block("hc", early, hyper)

    def original_block_tensors(self, i):
        """``{attention,feed_forward}_hyper_connection.*`` of block ``i``."""
        n, d = self.n, self.spec.d_model
        out = []
        for conn, sub in CONNECTORS:
            for key, shape, leaf in (("static_alpha", (n, n + 1), "A0"),
                                     ("dynamic_alpha_proj", (d, n + 1), "W_a"),
                                     ("dynamic_alpha_scale", (), "s_a"),
                                     ("static_beta", (n,), "beta0"),
                                     ("dynamic_beta_proj", (d,), "w_b"),
                                     ("dynamic_beta_scale", (), "s_b")):
                out.append(vector(f"{conn}.{key}", shape, f"blocks/residual/{leaf}", (i, sub)))
        return out

    # ------------------------------------------------------------ parameters
    def create_block_params(self, mod, ident):
        n, d = self.n, self.spec.d_model
        s0 = float(self.cfg.hc_scale_init)

        return {
            "A0": family_param(
                mod, "A0", hc_static_init(ident, n), (2, n, n + 1), (None, "streams", "routing")
            ),
            "beta0": family_param(mod, "beta0", nn.initializers.ones, (2, n), (None, "streams")),
            "W_a": family_param(
                mod, "W_a", nn.initializers.zeros, (2, d, n + 1), (None, "embed", "routing")
            ),
            "w_b": family_param(mod, "w_b", nn.initializers.zeros, (2, d), (None, "embed")),
            "s_a": family_param(mod, "s_a", nn.initializers.constant(s0), (2,), (None,)),
            "s_b": family_param(mod, "s_b", nn.initializers.constant(s0), (2,), (None,)),
        }

    # ------------------------------------------------------------ routing
    def coefficients(self, p, h_nbtd, sub: int):
        """``A`` ``[n, B, T, n+1]`` and ``beta`` ``[n, B, T]`` (fp32) of connector ``sub``."""
        h32 = h_nbtd.astype(jnp.float32)
        hn = h32 * jax.lax.rsqrt(jnp.mean(jnp.square(h32), axis=-1, keepdims=True) + HC_EPS)
        # One matmul for the n+1 mixing columns and the write weight.
        w_du = jnp.concatenate([p["W_a"][sub], p["w_b"][sub][:, None]], axis=-1)
        dyn = jnp.einsum("sbtd,du->sbtu", hn, w_du.astype(jnp.float32))
        if self.cfg.hc_tanh:
            dyn = jnp.tanh(dyn)
        a = p["A0"][sub][:, None, None, :] + p["s_a"][sub] * dyn[..., :-1]
        beta = p["beta0"][sub][:, None, None] + p["s_b"][sub] * dyn[..., -1]
        return a, beta

    def read(self, p, state, site):
        if fused.use_pallas(self.spec):
            return fused.hc_pre(p, site.sub, state, bool(self.cfg.hc_tanh))[0], {}
        a, beta = self.coefficients(p, state, site.sub)
        return mix_streams(a[..., :1], state)[0].astype(state.dtype), {"coefficients": (a, beta)}

    @property
    def mixes_state(self) -> bool:
        """Whether the write mixes the streams (the later rule) or adds to them."""
        return self.cfg.hc_write == "mixed"

    def write(self, p, state, y, site, aux, active):
        if fused.use_pallas(self.spec):
            _, mix, beta = fused.hc_pre(p, site.sub, state, bool(self.cfg.hc_tanh))
            if self.mixes_state:
                new = fused.stream_post(state, mix, beta, y)
            else:
                new = add_weighted(state, beta, y).astype(state.dtype)
            return gate(active, with_axes(new, NBTD), state)
        a, beta = coefficients(aux) or self.coefficients(p, state, site.sub)
        base = mix_streams(a[..., 1:], state) if self.mixes_state else state
        new = add_weighted(base, beta, y)
        return gate(active, with_axes(new.astype(state.dtype), NBTD), state)

    def probe(self, p, state, site):
        """The residual mixing ``A[s, t + 1]`` (``H[t] <- sum_s A[s, t+1] H[s]``),
        token-averaged: ``mixing`` ``[n, n]`` (the identity under the
        ``residual`` write rule, which does not mix the streams)."""
        if not self.mixes_state:
            return {"mixing": jnp.eye(self.n, dtype=jnp.float32)}
        a, _ = self.coefficients(p, state, site.sub)
        return {"mixing": jnp.mean(a[..., 1:], axis=(1, 2))}

    # ------------------------------------------------------------ costs
    def connector_params(self) -> int:
        """``n(n+2)`` static (``A0``: ``n(n+1)``, ``beta0``: ``n``) + ``d(n+2)`` dynamic
        (``W_a``: ``d(n+1)``, ``w_b``: ``d``) + 2 scalars (``s_a``, ``s_b``)."""
        n, d = self.n, self.spec.d_model
        return n * (n + 2) + d * (n + 2) + 2

    def extra_block_params(self) -> int:
        """Two connectors per block (attention and MLP)."""
        return 2 * self.connector_params()

    def extra_flops_per_token(self, seq_len: int) -> float:
        """Per connector (2L of them), counting multiply-adds as 2:

        * ``2 n d (n+2)``: the dynamic projection ``hn @ [W_a | w_b]``;
        * ``2 n (n+1) d``: the mix ``mixed[t] = sum_s A[s, t] H[s]``, ``t = 0..n``
          (``2 n d``, ``t = 0`` alone, under the ``residual`` write rule);
        * ``2 n d``: the write ``beta[t] * y`` added to ``n`` streams.

        The stream norms (``3 n d``) are left out like every norm in ``costs``."""
        n, d = self.n, self.spec.d_model
        mixed = n + 1 if self.mixes_state else 1
        per = 2 * n * d * (n + 2) + 2 * n * mixed * d + 2 * n * d
        return float(2 * self.spec.depth * per)
