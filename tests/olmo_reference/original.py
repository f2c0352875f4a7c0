"""The original DepthBench's designs where its own checkpoints do not decide: PyTorch models.

tests/fixtures/original_checkpoints/ holds every design as the original's own
code wrote it (tests/helpers/original_outputs.py tests them all).  What those
fixtures cannot tell apart is tested here, on models built from upstream
OLMo-core's own modules (``ai2-olmo-core``: attention, RoPE, SwiGLU, norms,
LM head):

* pre_ln, lns, sandwich_ln: upstream's ``default``, ``default_scaled`` and
  ``peri_norm`` blocks as they are (another OLMo-core release than the
  original's base, and its writer);
* mHC with routing far from its init: the fixtures' routing biases sit at
  their +-8 init (plus small noise), where the Sinkhorn is saturated and its
  forms (log or linear, ``[in, out]`` or ``[out, in]``) agree to 1e-4; here
  the PyTorch form (``mhc``, written from hyper_connections.py@f61f873
  ``_forward_mhc`` and model.py@8cc2fd74's readout) and Liger's (``mhc_liger``,
  liger-kernel's own kernels under ``TRITON_INTERPRET=1``);
* the forms the original trained first and the fixtures do not have: HC's
  residual write with each stream normed at the readout (``hc_early``), mHC
  with tanh and the same readout (``mhc_tanh``, @dc75a4e).

The blocks are written from the original's files (read, not copied;
docs/ORIGINAL.md cites each) with its module names, so ``state_dict()`` has
its checkpoint keys; :mod:`.step_dir` saves them with OLMo-core's writer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
from olmo_core.nn.transformer.block import TransformerBlock
from torch import nn

EPS = 1e-6  # the original's shape configs' rms_norm_eps (configs/llama_400m_L*.json)
DESIGNS = ("pre_ln", "lns", "sandwich_ln", "hc_early", "mhc", "mhc_tanh", "mhc_liger")
UPSTREAM = {"pre_ln": "default", "lns": "default_scaled", "sandwich_ln": "peri_norm"}
# Each design's readout: the streams summed before the head's norm (the final code,
# model.py@8cc2fd74), each stream normed then summed (the first forms, model.py@5152cab
# and before), or Liger's mean before the norm.
READOUT = {"hc_early": "norm_then_sum", "mhc": "sum_then_norm", "mhc_tanh": "norm_then_sum",
           "mhc_liger": "mean_then_norm"}


def base_config(depth: int, *, d_model: int = 32, n_heads: int = 4, n_kv_heads: int = 2,
                vocab: int = 61, block: str = "default") -> TransformerConfig:
    return TransformerConfig.llama_like(
        d_model=d_model, vocab_size=vocab, n_layers=depth, n_heads=n_heads,
        n_kv_heads=n_kv_heads, rope_theta=10_000, layer_norm_eps=EPS,
        block_name=TransformerBlockType(block))


def _kwargs(cfg: TransformerConfig, i: int) -> dict:
    b = cfg.block
    return dict(d_model=cfg.d_model, block_idx=i, n_layers=cfg.n_layers,
                sequence_mixer=b.sequence_mixer, feed_forward=b.feed_forward,
                layer_norm=b.layer_norm, init_device="cpu")


# ----------------------------------------------------------------- hyper-connections


def _rms(x, eps=1e-8):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def _to_streams(x, n):  # [B*n, T, d] (stream s of batch b at row b*n + s) -> [B, T, n, d]
    return x.reshape(x.shape[0] // n, n, *x.shape[1:]).movedim(1, -2)


def _from_streams(x):
    return x.movedim(-2, 1).reshape(x.shape[0] * x.shape[-2], *x.shape[1:-2], x.shape[-1])


def _sinkhorn_log(logits, iters):
    n = logits.shape[-1]
    z, log_m = logits.float(), -math.log(n)
    u, v = torch.zeros_like(z[..., 0]), torch.zeros_like(z[..., 0, :])
    for _ in range(iters):
        u = log_m - torch.logsumexp(z + v.unsqueeze(-2), dim=-1)
        v = log_m - torch.logsumexp(z + u.unsqueeze(-1), dim=-2)
    return torch.exp(z + u.unsqueeze(-1) + v.unsqueeze(-2)) * n


class Branch(nn.Module):
    """The pre-normed sublayer a connector wraps (the original registers it inside
    the connector, so its weights also appear under ``...hyper_connection.branch``)."""

    def __init__(self, norm, inner, attr):
        super().__init__()
        self.norm = norm
        setattr(self, attr, inner)
        self.attr = attr

    def forward(self, x):
        return getattr(self, self.attr)(self.norm(x))


class EarlyHC(nn.Module):
    """Dynamic hyper-connections (tanh) as the original first released them
    (hyper_connections.py@dc75a4e to @5152cab): ``A = A0 + s_a tanh(hn W_a)``,
    ``beta = beta0 + s_b tanh(hn w_b)``, the write ``H + beta y`` (the branch output
    added to the unmixed streams; its checkpoints are not among the fixtures)."""

    def __init__(self, n, d, layer_index, branch):
        super().__init__()
        self.n, self.branch = n, branch
        static = torch.zeros(n, n + 1)
        static[layer_index % n, 0] = 1.0
        static[:, 1:] = torch.eye(n)
        self.static_alpha = nn.Parameter(static)
        self.dynamic_alpha_proj = nn.Parameter(torch.zeros(d, n + 1))
        self.dynamic_alpha_scale = nn.Parameter(torch.tensor(0.01))
        self.static_beta = nn.Parameter(torch.ones(n))
        self.dynamic_beta_proj = nn.Parameter(torch.zeros(d))
        self.dynamic_beta_scale = nn.Parameter(torch.tensor(0.01))

    def forward(self, x):
        s = _to_streams(x, self.n)
        hn = _rms(s)
        alpha = self.static_alpha + self.dynamic_alpha_scale * torch.tanh(
            hn @ self.dynamic_alpha_proj)
        mixed = torch.einsum("...st,...sd->...td", alpha, s)
        y = self.branch(mixed[..., 0, :])
        beta = self.static_beta + self.dynamic_beta_scale * torch.tanh(hn @ self.dynamic_beta_proj)
        return x + _from_streams(y.unsqueeze(-2) * beta.unsqueeze(-1))


class MHC(nn.Module):
    """PyTorch mHC: sigmoid gates, log-domain Sinkhorn, ``h_res[s, t]``; ``tanh`` on
    the normalised projections only in the first mHC checkpoints (@dc75a4e)."""

    def __init__(self, n, d, layer_index, branch, iters=20, tanh=False):
        super().__init__()
        self.n, self.branch, self.iters = n, branch, iters
        self.act = torch.tanh if tanh else (lambda u: u)
        pre = torch.full((n,), -8.0)
        pre[layer_index % n] = 8.0
        self.pre_bias = nn.Parameter(pre)
        self.post_bias = nn.Parameter(torch.zeros(n))
        res = torch.full((n, n), -8.0)
        res.fill_diagonal_(0.0)
        self.residual_bias = nn.Parameter(res)
        self.pre_dynamic_proj = nn.Parameter(torch.zeros(n * d, n))
        self.post_dynamic_proj = nn.Parameter(torch.zeros(n * d, n))
        self.residual_dynamic_proj = nn.Parameter(torch.zeros(n * d, n * n))
        self.pre_gate = nn.Parameter(torch.tensor(0.01))
        self.post_gate = nn.Parameter(torch.tensor(0.01))
        self.residual_gate = nn.Parameter(torch.tensor(0.01))

    def forward(self, x):
        n = self.n
        s = _to_streams(x, n).float()
        f = _rms(s.reshape(*s.shape[:-2], -1))
        pre = torch.sigmoid(self.pre_gate * self.act(f @ self.pre_dynamic_proj) + self.pre_bias)
        post = 2.0 * torch.sigmoid(self.post_gate * self.act(f @ self.post_dynamic_proj)
                                   + self.post_bias)
        res = (self.residual_gate * self.act(f @ self.residual_dynamic_proj)).reshape(
            *f.shape[:-1], n, n) + self.residual_bias
        h_res = _sinkhorn_log(res, self.iters)
        y = self.branch(torch.einsum("...s,...sd->...d", pre, s))
        out = torch.einsum("...st,...sd->...td", h_res, s) + y.unsqueeze(-2) * post.unsqueeze(-1)
        return _from_streams(out)


class LigerMHC(nn.Module):
    """Liger mHC as ``LigerHyperConnection`` runs it: ``phi [n d, n^2 + 2n]`` stored in
    bf16 (its ``phi_dtype``), ``b`` and the three gates in fp32; coefficients,
    the branch input and the write by liger-kernel's own functions
    (``liger_mhc_coeffs``, ``liger_mhc_pre``, ``liger_mhc_post_res``: its Triton
    kernels), ``x_out[o] = sum_i h_res[o, i] x[i] + h_post[o] y``."""

    def __init__(self, n, d, layer_index, branch, iters=20):
        super().__init__()
        self.n, self.branch, self.iters = n, branch, iters
        m = n * n + 2 * n
        self.phi = nn.Parameter(torch.zeros(n * d, m, dtype=torch.bfloat16))
        b = torch.zeros(m)
        b[:n] = -8.0
        b[layer_index % n] = 8.0
        res = b[2 * n:].view(n, n)
        res.fill_(-8.0)
        res.fill_diagonal_(0.0)
        self.b = nn.Parameter(b)
        self.alpha_pre = nn.Parameter(torch.tensor(0.01))
        self.alpha_post = nn.Parameter(torch.tensor(0.01))
        self.alpha_res = nn.Parameter(torch.tensor(0.01))

    def forward(self, x):
        from liger_kernel.transformers.functional import (
            liger_mhc_coeffs,
            liger_mhc_post_res,
            liger_mhc_pre,
        )

        s = _to_streams(x, self.n).float().contiguous()
        h_pre, h_post, h_res = liger_mhc_coeffs(
            s, self.phi, self.b, self.alpha_pre, self.alpha_post, self.alpha_res,
            allow_fp32=True, tmax=self.iters, rms_eps=1e-6, pre_eps=0.0, sinkhorn_eps=1e-6,
            post_mult=2.0)
        y = self.branch(liger_mhc_pre(s, h_pre))
        return _from_streams(liger_mhc_post_res(s, y.float(), h_post, h_res))


class HyperBlock(TransformerBlock):
    """A pre-norm block whose two sublayers run inside connectors (no residual add)."""

    def __init__(self, connector, n, **kw):
        super().__init__(**kw)
        d, i = kw["d_model"], kw["block_idx"]
        self.attention_hyper_connection = connector(
            n, d, 2 * i, Branch(self.attention_norm, self.attention, "attention"))
        self.feed_forward_hyper_connection = connector(
            n, d, 2 * i + 1, Branch(self.feed_forward_norm, self.feed_forward, "feed_forward"))

    def forward(self, x, **kw):
        return self.feed_forward_hyper_connection(self.attention_hyper_connection(x))


class OriginalModel(nn.Module):
    """Embeddings, blocks and LM head (upstream's), run with the original's
    model-level flow: the streams expanded from one, then read out."""

    def __init__(self, upstream, blocks, *, streams: int, readout: str):
        super().__init__()
        self.embeddings, self.lm_head = upstream.embeddings, upstream.lm_head
        self.blocks = nn.ModuleDict({str(i): b for i, b in enumerate(blocks)})
        self.streams, self.readout = streams, readout

    def hidden(self, tokens):
        """The LM head's input (normalised)."""
        n = self.streams
        h = self.embeddings(tokens)
        h = h.unsqueeze(1).expand(-1, n, *h.shape[1:]).reshape(-1, *h.shape[1:])
        for block in self.blocks.values():
            h = block(h)
        norm = self.lm_head.norm
        streams = h.reshape(-1, n, *h.shape[1:])
        if self.readout == "norm_then_sum":
            return norm(h).reshape(-1, n, *h.shape[1:]).sum(1)
        return norm(streams.mean(1) if self.readout == "mean_then_norm" else streams.sum(1))

    def forward(self, tokens):
        return self.lm_head.w_out(self.hidden(tokens))


def build(design: str, depth: int = 3, **shape):
    """``(model, config.json's model section)`` for ``design`` (one of :data:`DESIGNS`)."""
    if design in UPSTREAM:  # upstream OLMo-core's own blocks, as they are
        cfg = base_config(depth, block=UPSTREAM[design], **shape)
        return cfg.build(init_device="cpu"), cfg.as_config_dict()
    if design not in READOUT:
        raise ValueError(f"unknown design {design!r}; one of {DESIGNS}")
    cfg = base_config(depth, **shape)
    upstream = cfg.build(init_device="cpu")
    raw = cfg.as_config_dict()
    n = 4
    if design == "hc_early":
        connector = EarlyHC
        # config.py@5152cab: an hc block, tanh saved (a bool then), collapse "auto"
        hyper = {"kind": "hc", "num_residual_streams": n, "tanh": True,
                 "gating_factor_init": 0.01, "collapse": "auto"}
    else:
        liger, tanh = design == "mhc_liger", design == "mhc_tanh"

        def connector(n, d, j, br):
            return LigerMHC(n, d, j, br) if liger else MHC(n, d, j, br, tanh=tanh)

        hyper = {"kind": "liger_mhc" if liger else "mhc", "num_residual_streams": n,
                 "tanh": tanh, "gating_factor_init": 0.01, "sinkhorn_iters": 20,
                 "sinkhorn_tau": 1.0, "collapse": "auto"}
    blocks = [HyperBlock(connector, n, **_kwargs(cfg, i)) for i in range(depth)]
    block = {**raw["block"], "name": "hc" if design == "hc_early" else "mhc",
             "hyper_connections": hyper}
    if design in ("mhc", "mhc_liger"):  # saved by config.py@8cc2fd74 and later
        block["moda_skip_ffn_kv"] = False
    return (OriginalModel(upstream, blocks, streams=n, readout=READOUT[design]),
            {**raw, "block": block})


def logits(model, tokens) -> torch.Tensor:
    """fp32 logits of an original model (upstream's Transformer or :class:`OriginalModel`)."""
    with torch.no_grad():
        return model(tokens).float()


def loss(model, tokens) -> torch.Tensor:
    """Mean next-token cross entropy on ``tokens [B, T + 1]``."""
    out = model(tokens[:, :-1]).float()
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), tokens[:, 1:].reshape(-1))
