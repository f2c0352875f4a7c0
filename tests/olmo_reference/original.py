"""The original DepthBench's designs as small PyTorch models on upstream OLMo-core modules.

:func:`build` returns ``(model, config)``: a model whose ``state_dict()``
keys are the original's (``embeddings.weight``, ``blocks.{i}...``,
``lm_head.{norm,w_out}.weight`` and each design's own) and the ``model``
section of the config.json the original's trainer would have saved for it.
The backbone (attention with RoPE, SwiGLU, RMSNorm/LayerNorm, LM head) is
upstream OLMo-core's; pre_ln, lns and sandwich_ln use its ``default``,
``default_scaled`` and ``peri_norm`` blocks unchanged.  The other blocks
follow the original's files (read, not copied; docs/ORIGINAL.md cites the
file and commit of each):

* deepnorm, keel, post-norm, depth-muP/CompleteP:
  ``olmo_core/nn/transformer/block.py``;
* HC (both write rules), PyTorch mHC, Liger mHC: ``olmo_core/nn/hyper_connections.py``
  (Liger's coefficients through liger-kernel's own ``liger_mhc_coeffs``);
* AttnRes (``fused_attnres``'s math in PyTorch): ``block.py``, ``model.py``,
  ``olmo_core/kernels/attnres.py``;
* MoDA (the depth attention of its ``parallel_moda`` kernel in PyTorch):
  ``olmo_core/nn/moda.py``, ``examples/moda_common.py``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from olmo_core.nn.layer_norm import LayerNormConfig, LayerNormType
from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
from olmo_core.nn.transformer.block import TransformerBlock
from torch import nn

EPS = 1e-6  # the original's shape configs' rms_norm_eps (configs/llama_400m_L*.json)
DESIGNS = ("pre_ln", "lns", "sandwich_ln", "deepnorm", "keel", "post_ln", "completep",
           "depth_mup", "completep_width", "hc", "hc_early", "mhc", "mhc_tanh", "mhc_liger",
           "attnres_full", "attnres_block", "moda_pre", "moda_post")
# completep_width: a depth-width muP run (pretrain_preln_mup.py@aba1f65), its LM head's
# output times d_base / d, recorded only through the embedding's AdamW eps override.
WIDTH_BASE = 16
UPSTREAM = {"pre_ln": "default", "lns": "default_scaled", "sandwich_ln": "peri_norm"}


def base_config(depth: int, *, d_model: int = 32, n_heads: int = 4, n_kv_heads: int = 2,
                vocab: int = 61, block: str = "default") -> TransformerConfig:
    return TransformerConfig.llama_like(
        d_model=d_model, vocab_size=vocab, n_layers=depth, n_heads=n_heads,
        n_kv_heads=n_kv_heads, rope_theta=10_000, layer_norm_eps=EPS,
        block_name=TransformerBlockType(block))


# ----------------------------------------------------------------- plain blocks


def _kwargs(cfg: TransformerConfig, i: int, **over) -> dict:
    b = cfg.block
    return dict(d_model=cfg.d_model, block_idx=i, n_layers=cfg.n_layers,
                sequence_mixer=b.sequence_mixer, feed_forward=b.feed_forward,
                layer_norm=over.pop("layer_norm", b.layer_norm), init_device="cpu", **over)


class DeepNormBlock(TransformerBlock):
    """``x <- LN(alpha x + F(x))``, ``alpha = (2L)^(1/4)``, LN mean-centred, no bias."""

    def forward(self, x, **kw):
        alpha = (2 * self.n_layers) ** 0.25
        h = self.attention_norm(alpha * x + self.attention(x))
        return self.feed_forward_norm(alpha * h + self.feed_forward(h))


class KeelBlock(TransformerBlock):
    """Block 0: ``h = x + Attn(N_a x)``, ``out = N_pf(h + MLP(N_f h))``; later blocks
    scale the carried stream by ``alpha = 2L`` inside ``N_pa`` and ``N_pf``."""

    def __init__(self, **kw):
        super().__init__(**kw)
        d, ln = kw["d_model"], kw["layer_norm"]
        self.post_attention_norm = None if self.block_idx == 0 else ln.build(d, init_device="cpu")
        self.post_feed_forward_norm = ln.build(d, init_device="cpu")

    def forward(self, x, **kw):
        alpha = float(2 * self.n_layers)
        a = self.attention(self.attention_norm(x))
        h = x + a if self.post_attention_norm is None else self.post_attention_norm(alpha * x + a)
        m = self.feed_forward(self.feed_forward_norm(h))
        carry = 1.0 if self.block_idx == 0 else alpha
        return self.post_feed_forward_norm(carry * h + m)


class PostNormBlock(TransformerBlock):
    """``x <- N(x + F(x))`` (the original's post-norm baseline, its MoDA comparison)."""

    def forward(self, x, **kw):
        h = self.attention_norm(x + self.attention(x))
        return self.feed_forward_norm(h + self.feed_forward(h))


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


class HC(nn.Module):
    """Dynamic hyper-connections (tanh): ``A = A0 + s_a tanh(hn W_a)``,
    ``beta = beta0 + s_b tanh(hn w_b)``; write ``mixed[1:] + beta y`` (the later
    rule) or ``H + beta y`` (``early``, the first released version)."""

    def __init__(self, n, d, layer_index, branch, early=False):
        super().__init__()
        self.n, self.branch, self.early = n, branch, early
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
        write = y.unsqueeze(-2) * beta.unsqueeze(-1)
        if self.early:
            return x + _from_streams(write)
        return _from_streams(mixed[..., 1:, :] + write)


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


# ----------------------------------------------------------------- AttnRes


def attnres_mix(query, residuals, rms_weight, output_rms_weight, eps):
    """``fused_attnres``: softmax over sources of ``sum_d q w v / rms(v)`` (scale 1),
    the weighted sum of the raw sources, then optionally an RMSNorm (same eps)."""
    v = torch.stack([r.float() for r in residuals])
    rstd = torch.rsqrt(v.pow(2).mean(-1) + eps)
    p = torch.softmax((v * (query.reshape(-1) * rms_weight)).sum(-1) * rstd, dim=0)
    o = (p.unsqueeze(-1) * v).sum(0)
    if output_rms_weight is not None:
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * output_rms_weight
    return o


class AttnResBlock(TransformerBlock):
    """Sources ``[x0, committed blocks..., partial]``; a boundary (``j % S == 0``)
    commits the partial before the mix; the mix carries the sublayer's pre-norm."""

    def __init__(self, size, **kw):
        super().__init__(**kw)
        d, i = kw["d_model"], kw["block_idx"]
        rms = LayerNormConfig(name=LayerNormType.rms, bias=False)
        if i > 0:
            self.attn_res_proj = nn.Linear(d, 1, bias=False)
            self.attn_res_norm = rms.build(d, init_device="cpu")
        self.mlp_res_proj = nn.Linear(d, 1, bias=False)
        self.mlp_res_norm = rms.build(d, init_device="cpu")
        self.attn_boundary = (2 * i) % size == 0
        self.mlp_boundary = (2 * i + 1) % size == 0

    def forward(self, x, states):
        partial = x
        if states is None:
            h = self.attention_norm(partial)
            states, partial = [partial], None
        else:
            sources = [*states, partial]
            if self.attn_boundary:
                states, partial = sources, None
            h = attnres_mix(self.attn_res_proj.weight, sources, self.attn_res_norm.weight,
                            self.attention_norm.weight, self.attn_res_norm.eps)
        a = self.attention(h)
        partial = a if partial is None else partial + a
        sources = [*states, partial]
        if self.mlp_boundary:
            states, partial = sources, None
        h = attnres_mix(self.mlp_res_proj.weight, sources, self.mlp_res_norm.weight,
                        self.feed_forward_norm.weight, self.mlp_res_norm.eps)
        m = self.feed_forward(h)
        return (m if partial is None else partial + m), states


# ----------------------------------------------------------------- MoDA


class MoDAAttention(nn.Module):
    """Upstream attention whose block ``b > 0`` softmax also covers the depth
    keys/values at the same token (slots ``0 .. 2b-1``), with the rotated query;
    writes its own pre-RoPE ``k, v`` to slot ``2b``."""

    def __init__(self, attention, block_idx):
        super().__init__()
        self.attention, self.block_idx = attention, block_idx

    def forward(self, x, bank):
        a = self.attention
        B, T, _ = x.shape
        h = a.head_dim
        q = a.w_q(x).view(B, T, -1, h)
        k = a.w_k(x).view(B, T, -1, h)
        v = a.w_v(x).view(B, T, -1, h)
        bank.append((k, v))  # cache_post_norm_k: there is no k norm, so the raw k
        q_rot, k_rot = a.rope(q, k, head_first=False)
        group = q.shape[2] // k.shape[2]
        kq = k_rot.repeat_interleave(group, dim=2)
        vq = v.repeat_interleave(group, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q_rot, kq) / math.sqrt(h)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        if self.block_idx == 0:
            att = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, -1), vq)
        else:
            dk = torch.stack([c[0] for c in bank[:-1]], 2).repeat_interleave(group, dim=3)
            dv = torch.stack([c[1] for c in bank[:-1]], 2).repeat_interleave(group, dim=3)
            depth = torch.einsum("bthd,btshd->bhts", q_rot, dk) / math.sqrt(h)
            p = torch.softmax(torch.cat([scores, depth], -1), -1)
            att = (torch.einsum("bhqk,bkhd->bqhd", p[..., :T], vq)
                   + torch.einsum("bhts,btshd->bthd", p[..., T:], dv))
        return a.w_out(att.reshape(B, T, -1))


class MoDAFeedForward(nn.Module):
    """The MLP plus its extra depth K/V projection (absent on the last block)."""

    def __init__(self, feed_forward, d, n_kv, h, last):
        super().__init__()
        self.feed_forward = feed_forward
        self.kv_proj = None if last else nn.Linear(d, 2 * n_kv * h, bias=False)
        self.n_kv, self.h = n_kv, h

    def forward(self, x, bank):
        if self.kv_proj is not None:
            B, T, _ = x.shape
            k, v = self.kv_proj(x).view(B, T, 2, self.n_kv, self.h).unbind(2)
            bank.append((k, v))
        return self.feed_forward(x)


class MoDABlock(TransformerBlock):
    def __init__(self, post, **kw):
        super().__init__(**kw)
        a = self.attention
        self.post = post
        self.attention = MoDAAttention(a, self.block_idx)
        self.feed_forward = MoDAFeedForward(self.feed_forward, kw["d_model"], a.n_kv_heads,
                                            a.head_dim, self.block_idx == self.n_layers - 1)

    def forward(self, x, bank):
        if self.post:
            h = self.attention_norm(x + self.attention(x, bank))
            return self.feed_forward_norm(h + self.feed_forward(h, bank))
        h = x + self.attention(self.attention_norm(x), bank)
        return h + self.feed_forward(self.feed_forward_norm(h), bank)


# ----------------------------------------------------------------- the model


class OriginalModel(nn.Module):
    """Embeddings, blocks and LM head (upstream's), run with the original's
    model-level flow: HC streams expanded from and collapsed to one, AttnRes's
    source list and final mix (fused with the head's norm), MoDA's depth bank."""

    def __init__(self, upstream, blocks, *, streams=0, mean=False, kind=""):
        super().__init__()
        self.embeddings, self.lm_head = upstream.embeddings, upstream.lm_head
        self.blocks = nn.ModuleDict({str(i): b for i, b in enumerate(blocks)})
        self.streams, self.mean, self.kind = streams, mean, kind
        if kind == "attnres":
            d = upstream.d_model
            self.res_proj = nn.Linear(d, 1, bias=False)
            self.res_norm = LayerNormConfig(name=LayerNormType.rms, bias=False).build(
                d, init_device="cpu")

    def hidden(self, tokens):
        """The LM head's input (normalised)."""
        h = self.embeddings(tokens)
        n = self.streams
        if n:
            h = h.unsqueeze(1).expand(-1, n, *h.shape[1:]).reshape(-1, *h.shape[1:])
        states, bank = None, []
        for block in self.blocks.values():
            if self.kind == "attnres":
                h, states = block(h, states)
            elif self.kind == "moda":
                h = block(h, bank)
            else:
                h = block(h)
        norm = self.lm_head.norm
        if self.kind == "attnres":
            return attnres_mix(self.res_proj.weight, [*states, h], self.res_norm.weight,
                               norm.weight, self.res_norm.eps)
        if n and self.mean:
            return norm(h.reshape(-1, n, *h.shape[1:]).mean(1))
        if n:
            return norm(h).reshape(-1, n, *h.shape[1:]).sum(1)
        return norm(h)

    def forward(self, tokens):
        return self.lm_head.w_out(self.hidden(tokens)) * self.head_scale

    head_scale = 1.0  # the depth-width runs' patched head multiplies its output


def _block_cfg(cfg: dict, **fields) -> dict:
    out = {k: v for k, v in cfg.items()}
    block = dict(out["block"])
    block.update(fields)
    out["block"] = block
    return out


def build(design: str, depth: int = 3, *, attnres_size: int = 2, base_depth: int = 2, **shape):
    """``(model, config.json's model section)`` for ``design`` (one of :data:`DESIGNS`)."""
    if design in UPSTREAM:  # upstream OLMo-core's own blocks, as they are
        cfg = base_config(depth, block=UPSTREAM[design], **shape)
        return cfg.build(init_device="cpu"), cfg.as_config_dict()
    cfg = base_config(depth, **shape)
    upstream = cfg.build(init_device="cpu")
    raw = cfg.as_config_dict()
    L = depth
    if design == "deepnorm":
        ln = LayerNormConfig(name=LayerNormType.default, eps=EPS, bias=False)
        blocks = [DeepNormBlock(**_kwargs(cfg, i, layer_norm=ln)) for i in range(L)]
        raw = _block_cfg(raw, name="deepnorm")
        raw["block"]["layer_norm"] = {**raw["block"]["layer_norm"], "name": "default"}
        return OriginalModel(upstream, blocks), raw
    if design == "keel":
        return (OriginalModel(upstream, [KeelBlock(**_kwargs(cfg, i)) for i in range(L)]),
                _block_cfg(raw, name="keel"))
    if design == "post_ln":
        return (OriginalModel(upstream, [PostNormBlock(**_kwargs(cfg, i)) for i in range(L)]),
                _block_cfg(raw, name="post_norm"))
    if design in ("completep", "depth_mup", "completep_width"):
        alpha = 0.5 if design == "depth_mup" else 1.0
        s = (L / base_depth) ** -alpha
        blocks = [TransformerBlock(**_kwargs(cfg, i, attention_residual_alpha=s,
                                             feed_forward_residual_alpha=s)) for i in range(L)]
        model = OriginalModel(upstream, blocks)
        if design == "completep_width":
            model.head_scale = WIDTH_BASE / cfg.d_model
        return model, _block_cfg(raw, name="depth_mup" if design == "depth_mup" else "completep",
                                 residual_scaling_base_depth=base_depth)
    if design in ("hc", "hc_early", "mhc", "mhc_tanh", "mhc_liger"):
        n = 4
        if design.startswith("hc"):
            early = design == "hc_early"

            def connector(n, d, j, br):
                return HC(n, d, j, br, early=early)

            hyper = {"kind": "hc", "num_residual_streams": n, "tanh": True,
                     "gating_factor_init": 0.01}
            if not early:  # the later configs (and code) carry 'collapse'
                hyper["collapse"] = "auto"
        else:
            liger, tanh = design == "mhc_liger", design == "mhc_tanh"

            def connector(n, d, j, br):
                return LigerMHC(n, d, j, br) if liger else MHC(n, d, j, br, tanh=tanh)

            hyper = {"kind": "liger_mhc" if liger else "mhc", "num_residual_streams": n,
                     "tanh": tanh, "gating_factor_init": 0.01, "sinkhorn_iters": 20,
                     "sinkhorn_tau": 1.0, "collapse": "auto"}
        blocks = [HyperBlock(connector, n, **_kwargs(cfg, i)) for i in range(L)]
        name = "hc" if design.startswith("hc") else "mhc"
        return (OriginalModel(upstream, blocks, streams=n, mean=design == "mhc_liger"),
                _block_cfg(raw, name=name, hyper_connections=hyper))
    if design in ("attnres_full", "attnres_block"):
        size = 1 if design == "attnres_full" else attnres_size
        blocks = [AttnResBlock(size, **_kwargs(cfg, i)) for i in range(L)]
        return (OriginalModel(upstream, blocks, kind="attnres"),
                _block_cfg(raw, name="attnres", attnres_block_size=size))
    if design in ("moda_pre", "moda_post"):
        post = design == "moda_post"
        blocks = [MoDABlock(post, **_kwargs(cfg, i)) for i in range(L)]
        moda = {"backend": "v17", "cache_post_norm_k": True, "extra_ffn_kv_proj": True,
                "extra_attn_kv_proj": False, "depth_bs": 64, "depth_warps": 4}
        raw = _block_cfg(raw, name="post_norm_moda" if post else "moda", moda=moda)
        raw["block_overrides"] = {str(L - 1): {**raw["block"], "moda_skip_ffn_kv": True}}
        return OriginalModel(upstream, blocks, kind="moda"), raw
    raise ValueError(f"unknown design {design!r}; one of {DESIGNS}")


def train_module(design: str, d_model: int = 32) -> dict | None:
    """config.json's ``train_module`` where a design's config records something
    there (a depth-width run: the embedding's AdamW eps divided by ``d / d_base``);
    None: the default section."""
    if design != "completep_width":
        return None
    eps = 1e-8
    return {"optim": {"lr": 2e-3, "eps": eps, "weight_decay": 0.1, "group_overrides": [
        {"params": ["embeddings.weight"], "opts": {"eps": eps / (d_model / WIDTH_BASE)}}]}}


def logits(model, tokens) -> torch.Tensor:
    """fp32 logits of an original model (upstream's Transformer or :class:`OriginalModel`)."""
    with torch.no_grad():
        return model(tokens).float()


def loss(model, tokens) -> torch.Tensor:
    """Mean next-token cross entropy on ``tokens [B, T + 1]``."""
    out = model(tokens[:, :-1]).float()
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), tokens[:, 1:].reshape(-1))
