"""mhc: manifold-constrained hyper-connections (DeepSeek, 2025), ``n = 4``, no tanh.

For sublayer ``j`` with ``k = j mod n``, in DeepSeek's fused form (one ``nd x
(n^2 + 2n)`` matrix ``phi``, the RMS division after the matmul)::

    u = (concat_s H[s] @ phi) / rms(concat_s H[s]) = [u_pre | u_post | u_res]   (fp32)
    read:  x = sum_s sigmoid(a_pre u_pre + b_pre)[s] H[s];  y = F(N(x))
    write: H[t] <- sum_s P[s, t] H[s] + 2 sigmoid(a_post u_post + b_post)[t] y,
           P from sinkhorn(a_res reshape(u_res, (n, n)) + B_res)   (sinkhorn_iters,
                                                      sinkhorn_temperature)

The original benchmark trained two forms, Liger's (the default, its 400M runs)
and PyTorch mHC's; every choice that separates them is a field
(``mhc_sinkhorn``, ``mhc_sinkhorn_eps``, ``mhc_rms_eps``, ``mhc_res_layout``,
``mhc_gate_decay``, ``mhc_phi_dtype``, ``mhc_tanh``, ``readout``: their table,
the init and the variants ``mhc+pytorch`` and ``mhc+pytorch_early`` are in
docs/spec/residuals.md, family 7).  A run directory saved before these
fields existed trained the PyTorch form with ``norm_then_sum`` and reads as
it (``saved_before``).

``phi`` is stored as ``[n, d, n^2 + 2n]`` (the same matrix, rows split by
stream so its ``d`` axis shards like the streams' feature axis); the
init biases ``+-mhc_bias`` (8) and the gates' ``hc_scale_init`` (0.01) are fields.
Two connectors per block, stacked on a leading axis of size 2; all
coefficient maths in fp32.  As in hc, ``read`` hands its coefficients to
``write``.  The Pallas kernels
(``model.impl = pallas``, or ``auto`` on one TPU/GPU) compute every form:
the Sinkhorn kind, ``R``'s layout and ``tanh`` are static options of
``pallas_kernels.mhc_pre``, ``phi`` is cast to fp32 before the product as
here; the readout is the head's (``streams.py``), not the kernel's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from depthbench.errors import ConfigError
from depthbench.model.residual.parts import fused
from depthbench.model.residual.parts.sinkhorn import sinkhorn, sinkhorn_flops, sinkhorn_linear
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
    stream_sum,
)
from depthbench.model.residual.protocol.base import family_param, gate, with_axes
from depthbench.model.residual.protocol.family_config import check_choice, check_number
from depthbench.model.residual.protocol.original_format import Place, Reading, Tensor, vector

SINKHORNS = ("linear", "log")
LAYOUTS = ("out_in", "in_out")
PHI_DTYPES = ("bfloat16", "float32", "param")
GATES = frozenset({"a_pre", "a_post", "a_res"})


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


# The PyTorch mHC of the original benchmark's final code (hyper_connections.py@f61f873
# ``_forward_mhc``, model.py@8cc2fd74's readout), and its first form (tanh on, each
# stream through the head's norm: config.py and model.py@dc75a4e).
PYTORCH = {"mhc_sinkhorn": "log", "mhc_res_layout": "in_out", "mhc_rms_eps": 1e-8,
           "mhc_gate_decay": True, "mhc_phi_dtype": "param", "readout": "sum_then_norm"}
PYTORCH_EARLY = {**PYTORCH, "readout": "norm_then_sum", "mhc_tanh": True}


@dataclasses.dataclass(frozen=True)
class MHCConfig(StreamConfig):
    readout: str = "mean_then_norm"  # Liger's mean collapse (streams.py)
    sinkhorn_iters: int = 20
    sinkhorn_temperature: float = 1.0
    mhc_bias: float = 8.0  # |b_pre| and -B_res off-diagonal at init
    mhc_sinkhorn: str = "linear"  # "linear" (Liger) | "log" (PyTorch mHC)
    mhc_sinkhorn_eps: float = 1e-6  # linear: added to every sum (Liger's sinkhorn_eps)
    mhc_rms_eps: float = 1e-6  # eps of rms(f) (Liger's rms_eps; PyTorch mHC 1e-8)
    mhc_res_layout: str = "out_in"  # R[out, in] (Liger) | R[in, out] (PyTorch mHC)
    mhc_gate_decay: bool = False  # weight decay on a_pre, a_post, a_res
    mhc_phi_dtype: str = "bfloat16"  # phi's storage: bfloat16 (Liger) | float32 | param
    mhc_tanh: bool = False  # tanh(u) before the gates (the first mHC checkpoints)

    variants = {**StreamConfig.variants, "pytorch": PYTORCH, "pytorch_early": PYTORCH_EARLY}
    # Run directories saved before these fields existed trained the PyTorch form
    # with fp32 phi and rms(f)'s eps = model.norm_eps (1e-6 by default).
    saved_before = {**PYTORCH, "mhc_rms_eps": 1e-6, "mhc_phi_dtype": "float32",
                    "readout": "norm_then_sum"}

    def validate(self, config) -> None:
        super().validate(config)
        check_number("sinkhorn_iters", self.sinkhorn_iters, 1, integer=True)
        check_number("sinkhorn_temperature", self.sinkhorn_temperature, 0.0, exclusive=True)
        check_number("mhc_bias", self.mhc_bias, 0.0,
                     meaning="|b_pre| and -B_res off-diagonal at init")
        check_choice("mhc_sinkhorn", self.mhc_sinkhorn, SINKHORNS)
        check_number("mhc_sinkhorn_eps", self.mhc_sinkhorn_eps, 0.0, 1e-2,
                     meaning="added to every row and column sum of the linear Sinkhorn")
        check_number("mhc_rms_eps", self.mhc_rms_eps, 0.0, 1e-2, exclusive=True,
                     meaning="eps of the streams' RMS")
        check_choice("mhc_res_layout", self.mhc_res_layout, LAYOUTS)
        check_choice("mhc_phi_dtype", self.mhc_phi_dtype, PHI_DTYPES)


@dataclasses.dataclass(frozen=True)
class MHC(StreamFamily):
    name = "mhc"
    description = (
        "manifold-constrained hyper-connections: sigmoid read/write gates and a "
        "Sinkhorn (doubly-stochastic) stream mix"
    )
    reference = "Xie et al. (DeepSeek-AI) 2025, mHC: Manifold-Constrained Hyper-Connections"
    Config = MHCConfig
    # MHCTransformerBlock (block.py@6bdf2ad), its connector's PyTorch form
    # (HyperConnection._forward_mhc) or Liger's (LigerHyperConnection).
    original_blocks = ("mhc",)
    original_kinds = ("mhc", "liger_mhc")

    @property
    def no_decay(self) -> frozenset[str]:  # type: ignore[override]
        """The static biases; the gates too unless ``mhc_gate_decay``."""
        static = frozenset({"b_pre", "b_post", "B_res"})
        return static if self.cfg.mhc_gate_decay else static | GATES

    @property
    def width(self) -> int:
        """Columns of ``phi``: ``n`` (pre) + ``n`` (post) + ``n^2`` (res)."""
        return self.n * self.n + 2 * self.n

    @property
    def linear(self) -> bool:
        return self.cfg.mhc_sinkhorn == "linear"

    def _pallas(self) -> bool:
        return fused.use_pallas(self.spec)

    # ------------------------------------------------------------ parameters
    def create_block_params(self, mod, ident):
        n, d = self.n, self.spec.d_model
        s0 = float(self.cfg.hc_scale_init)
        bias = float(self.cfg.mhc_bias)
        phi_dtype = {"param": self.spec.pdtype}.get(self.cfg.mhc_phi_dtype,
                                                    self.cfg.mhc_phi_dtype)

        gate_init = nn.initializers.constant(s0)
        return {
            "phi": family_param(
                mod,
                "phi",
                nn.initializers.zeros,
                (2, n, d, self.width),
                (None, "streams", "embed", "routing"),
                phi_dtype,
            ),
            "a_pre": family_param(mod, "a_pre", gate_init, (2,), (None,)),
            "a_post": family_param(mod, "a_post", gate_init, (2,), (None,)),
            "a_res": family_param(mod, "a_res", gate_init, (2,), (None,)),
            "b_pre": family_param(
                mod, "b_pre", mhc_bias_init(ident, n, bias), (2, n), (None, "streams")
            ),
            "b_post": family_param(mod, "b_post", nn.initializers.zeros, (2, n), (None, "streams")),
            # Logical names must be distinct: the second stream axis is unnamed.
            "B_res": family_param(
                mod, "B_res", mhc_res_init(n, bias), (2, n, n), (None, "streams", None)
            ),
        }

    # ------------------------------------------------------------ routing
    def coefficients(self, p, h_nbtd, sub: int):
        """``pre`` ``[n, B, T]``, ``post`` ``[n, B, T]``, ``P`` ``[n, B, T, n]`` (fp32)."""
        n, cfg = self.n, self.cfg
        h32 = h_nbtd.astype(jnp.float32)
        # rms over the n*d concatenation = sqrt(mean over streams and features).
        # (over the streams as a chain: see stream_sum)
        ms_bt = stream_sum(jnp.mean(jnp.square(h32), axis=-1)) / n
        inv_r_bt = jax.lax.rsqrt(ms_bt + float(cfg.mhc_rms_eps))
        u = jnp.einsum("sbtd,sdm->btm", h32, p["phi"][sub].astype(jnp.float32))
        u = u * inv_r_bt[..., None]
        if cfg.mhc_tanh:
            u = jnp.tanh(u)
        pre = jax.nn.sigmoid(p["a_pre"][sub] * u[..., :n] + p["b_pre"][sub])
        post = 2.0 * jax.nn.sigmoid(p["a_post"][sub] * u[..., n : 2 * n] + p["b_post"][sub])
        r_btnn = p["a_res"][sub] * u[..., 2 * n :].reshape(*u.shape[:-1], n, n) + p["B_res"][sub]
        iters, temp = int(cfg.sinkhorn_iters), float(cfg.sinkhorn_temperature)
        if self.linear:
            m_btnn = sinkhorn_linear(r_btnn, iters, float(cfg.mhc_sinkhorn_eps), temp)
        else:
            m_btnn = sinkhorn(r_btnn, iters, temp)
        # P[s = in, t = out]: the Sinkhorn output itself, or its transpose when R
        # is laid out [out, in].
        p_btst = m_btnn if cfg.mhc_res_layout == "in_out" else jnp.swapaxes(m_btnn, -1, -2)
        return (jnp.moveaxis(pre, -1, 0), jnp.moveaxis(post, -1, 0), jnp.moveaxis(p_btst, -2, 0))

    def _fused_pre(self, p, state, sub: int):
        cfg = self.cfg
        iters, temp = int(cfg.sinkhorn_iters), float(cfg.sinkhorn_temperature)
        return fused.mhc_pre(p, sub, state, iters, temp, float(cfg.mhc_rms_eps),
                             sinkhorn=cfg.mhc_sinkhorn, sinkhorn_eps=float(cfg.mhc_sinkhorn_eps),
                             layout=cfg.mhc_res_layout, use_tanh=bool(cfg.mhc_tanh))

    def read(self, p, state, site):
        if self._pallas():
            return self._fused_pre(p, state, site.sub)[0], {}
        pre, post, p_sbtt = self.coefficients(p, state, site.sub)
        return (mix_streams(pre[..., None], state)[0].astype(state.dtype),
                {"coefficients": (post, p_sbtt)})

    def write(self, p, state, y, site, aux, active):
        if self._pallas():
            _, mix, post = self._fused_pre(p, state, site.sub)
            return gate(active, with_axes(fused.stream_post(state, mix, post, y), NBTD), state)
        post, p_sbtt = coefficients(aux) or self.coefficients(p, state, site.sub)[1:]
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
        * ``sinkhorn_flops(n, iters)``: ``6 n^2`` per iteration in the log domain,
          ``4 n^2`` in the linear one (see ``sinkhorn``);
        * ``2 n d``: the read ``sum_s pre[s] H[s]``;
        * ``2 n^2 d``: the stream mix ``sum_s P[s, t] H[s]``;
        * ``2 n d``: the write ``post[t] * y`` into ``n`` streams.

        The RMS of ``f`` (``2 n d``) is a norm and left out, as in ``costs``."""
        n, d = self.n, self.spec.d_model
        iters = int(self.cfg.sinkhorn_iters)
        per = (2 * n * d * self.width + sinkhorn_flops(n, iters, self.linear) + 2 * n * d
               + 2 * n * n * d)
        per += 2 * n * d
        return float(2 * self.spec.depth * per)

    def layout(self) -> str:
        """``linear/out_in,mean_then_norm``: the Sinkhorn form, ``R``'s layout, the readout."""
        return f"{self.cfg.mhc_sinkhorn}/{self.cfg.mhc_res_layout},{self.readout_mode}"

    def describe(self) -> dict:
        return {
            **super().describe(),
            "sinkhorn_iters": int(self.cfg.sinkhorn_iters),
            "sinkhorn": self.cfg.mhc_sinkhorn,
            "res_layout": self.cfg.mhc_res_layout,
            "mhc_bias": float(self.cfg.mhc_bias),
        }

    # ------------------------------------------------------------ the original's format
    @classmethod
    def from_original(cls, block, saved, options):
        hc, kind, form, f = read_hyper_connections(block, cls.original_kinds, options)
        residual = {"hc_n": f["hc_n"], "hc_scale_init": f["hc_scale_init"],
                    "readout": f["readout"], "mhc_tanh": f["tanh"],
                    "sinkhorn_iters": hc.int("sinkhorn_iters", default=20)}
        if kind == "liger_mhc":
            # LigerHyperConnection's own defaults, overridable by the config's liger_* keys.
            residual.update(
                sinkhorn_temperature=1.0, mhc_sinkhorn="linear", mhc_res_layout="out_in",
                mhc_sinkhorn_eps=hc.num("liger_sinkhorn_eps", 1e-6),
                mhc_rms_eps=hc.num("liger_rms_eps", 1e-6), mhc_gate_decay=False,
                mhc_phi_dtype=hc.choice("liger_phi_dtype", ("bfloat16", "float32"),
                                        "bfloat16"))
            for key, want in (("liger_pre_eps", 0.0), ("liger_post_mult", 2.0)):
                hc.must(hc.num(key, want) == want,
                        f"{key} = {hc.num(key, want)} is not supported (depthbench's mhc has "
                        f"{want:g})")
        else:  # PyTorch mHC: _forward_mhc's rms(f) eps 1e-8, log-domain sinkhorn_log
            residual.update(sinkhorn_temperature=hc.num("sinkhorn_tau", 1.0),
                            mhc_sinkhorn="log", mhc_res_layout="in_out", mhc_rms_eps=1e-8,
                            mhc_gate_decay=True, mhc_phi_dtype="param")
        return Reading(block="mhc", residual=residual, choice=form)

    @property
    def liger(self) -> bool:
        """Whether this is the Liger form (one ``phi`` and one ``b`` in the
        checkpoint) rather than the PyTorch one (three projections and biases)."""
        return self.cfg.mhc_res_layout == "out_in"

    def to_original(self):
        cfg, n = self.cfg, self.n
        hyper = {"num_residual_streams": n, "gating_factor_init": float(cfg.hc_scale_init),
                 "sinkhorn_iters": int(cfg.sinkhorn_iters), "collapse": "auto"}
        liger = {"mhc_sinkhorn": "linear", "mhc_res_layout": "out_in", "mhc_gate_decay": False,
                 "readout": "mean_then_norm", "mhc_tanh": False, "sinkhorn_temperature": 1.0}
        pytorch = {"mhc_sinkhorn": "log", "mhc_res_layout": "in_out", "mhc_rms_eps": 1e-8,
                   "mhc_gate_decay": True, "mhc_phi_dtype": "param"}
        have = dataclasses.asdict(cfg)
        if all(have[k] == v for k, v in liger.items()) and cfg.mhc_phi_dtype != "param":
            return hyper_block("mhc", False, {
                **hyper, "kind": "liger_mhc", "liger_phi_dtype": cfg.mhc_phi_dtype,
                "liger_rms_eps": float(cfg.mhc_rms_eps),
                "liger_sinkhorn_eps": float(cfg.mhc_sinkhorn_eps)})
        early = {"sum_then_norm": False, "norm_then_sum": True}.get(self.readout_mode)
        if not all(have[k] == v for k, v in pytorch.items()) or early is None or (
                early != bool(cfg.mhc_tanh)):
            raise ConfigError("the original trained mHC in Liger's form and in PyTorch's "
                              "(final, or tanh with norm_then_sum): this mhc is neither "
                              f"({self.layout()}, tanh {cfg.mhc_tanh})")
        return hyper_block("mhc", early, {**hyper, "kind": "mhc", "tanh": bool(cfg.mhc_tanh),
                                          "sinkhorn_tau": float(cfg.sinkhorn_temperature)})

    def original_block_tensors(self, i):
        """``{attention,feed_forward}_hyper_connection.*`` of block ``i``: Liger's
        ``phi [n*d, n^2 + 2n]`` (columns pre | post | res, rows stream-major like
        depthbench's ``phi [n, d, m]``, the res part ``[out, in]`` as
        ``mhc_res_layout = out_in`` reads it) and ``b`` in the same order; or the
        PyTorch form's three projections, one column block of ``phi`` each
        (``[in, out]``: ``einsum("st,sd->td")``), its biases and gates."""
        n, d, width = self.n, self.spec.d_model, self.width
        out = []
        for conn, sub in CONNECTORS:
            c, at = f"{conn}.", (i, sub)
            if self.liger:
                out += [
                    Tensor(c + "phi", (n * d, width), (Place(
                        "blocks/residual/phi", at, lambda w: w.reshape(n, d, width),
                        lambda x: x.reshape(n * d, width)),)),
                    Tensor(c + "b", (width,), (
                        Place("blocks/residual/b_pre", at, lambda b: b[:n]),
                        Place("blocks/residual/b_post", at, lambda b: b[n:2 * n]),
                        Place("blocks/residual/B_res", at, lambda b: b[2 * n:].reshape(n, n),
                              lambda x: x.reshape(n * n))), join=np.concatenate),
                    *(vector(c + f"alpha_{g}", (), f"blocks/residual/a_{g}", at)
                      for g in ("pre", "post", "res"))]
                continue
            for key, cols in (("pre_dynamic_proj", slice(0, n)),
                              ("post_dynamic_proj", slice(n, 2 * n)),
                              ("residual_dynamic_proj", slice(2 * n, width))):
                span = cols.stop - cols.start
                out.append(Tensor(c + key, (n * d, span), (Place(
                    "blocks/residual/phi", (*at, slice(None), slice(None), cols),
                    lambda w, span=span: w.reshape(n, d, span),
                    lambda x, span=span: x.reshape(n * d, span)),)))
            out += [vector(c + "pre_bias", (n,), "blocks/residual/b_pre", at),
                    vector(c + "post_bias", (n,), "blocks/residual/b_post", at),
                    vector(c + "residual_bias", (n, n), "blocks/residual/B_res", at),
                    *(vector(c + f"{g}_gate", (), f"blocks/residual/a_{ours}", at)
                      for g, ours in (("pre", "pre"), ("post", "post"), ("residual", "res")))]
        return out
