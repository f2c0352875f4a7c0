"""Device-side passes over held-out windows: everything reduced to sums before
it leaves the device (a captured baseline forward, ``K`` skips at once, ``K``
swaps at once).  Token sums are over next-token positions (``T - 1`` per
window) for losses and the lens, over all positions for state geometry."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from depthbench.analysis.metrics import effective_rank, stable_rank
from depthbench.model.transformer import CAPTURES

TOP_K = 5
_COMPILED: dict = {}
_COMPILED_MAX = 32


def cached(kind: str, run, build):
    """``build()`` once per (kind, model spec, mesh): runs of the same model
    (e.g. ``Run.with_params`` copies, or the same shape in a sweep) share
    their jitted functions and so their compilations."""
    key = (kind, run.spec, run.mesh)
    if key not in _COMPILED:
        while len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = build()
    return _COMPILED[key]


def nll_sum(logits_btv, tokens_bt):
    """Summed next-token cross entropy (fp32) over ``B * (T - 1)`` positions."""
    logp = jax.nn.log_softmax(logits_btv[:, :-1].astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.take_along_axis(logp, tokens_bt[:, 1:, None], axis=-1))


def _lens_sums(lens_lbtv, logits_btv, tokens_bt):
    final = jax.nn.log_softmax(logits_btv[:, :-1].astype(jnp.float32), axis=-1)
    final_top = jax.lax.top_k(final, TOP_K)[1]

    def one(lens_btv):
        logp = jax.nn.log_softmax(lens_btv[:, :-1].astype(jnp.float32), axis=-1)
        ce = -jnp.sum(jnp.take_along_axis(logp, tokens_bt[:, 1:, None], axis=-1))
        kl = jnp.sum(jnp.exp(final) * (final - logp))
        top = jax.lax.top_k(logp, TOP_K)[1]
        hits = jnp.any(top[..., :, None] == final_top[..., None, :], axis=-1)
        return ce, kl, jnp.sum(hits) / TOP_K

    return jax.lax.map(one, lens_lbtv)


def _angular_sum(z_lbtd):
    z = z_lbtd.astype(jnp.float32)
    unit = z * jax.lax.rsqrt(jnp.maximum(jnp.sum(z * z, axis=-1, keepdims=True), 1e-16))
    cos = jnp.clip(jnp.einsum("ibtd,jbtd->ijbt", unit, unit), -1.0, 1.0)
    return jnp.sum(jnp.arccos(cos), axis=(2, 3)) / jnp.pi


def _streams(z_lbtd, d_model: int):
    """Per depth, summed over tokens: mean pairwise cosine between the ``n``
    streams and the singular values of each token's ``n x d`` stream matrix."""
    n = z_lbtd.shape[-1] // d_model
    h = z_lbtd.astype(jnp.float32).reshape(*z_lbtd.shape[:-1], n, d_model)
    unit = h * jax.lax.rsqrt(jnp.maximum(jnp.sum(h * h, axis=-1, keepdims=True), 1e-16))
    cos = jnp.einsum("lbtsd,lbtud->lbtsu", unit, unit)
    i, j = np.triu_indices(n, 1)
    pair_cos = jnp.mean(cos[..., i, j], axis=-1)
    svals = jnp.linalg.svd(h, compute_uv=False)  # [L+1, B, T, n]
    return jnp.sum(pair_cos, axis=(1, 2)), svals


def make_baseline(run):
    """``(params, tokens) -> (dict of sums, z)`` for one chunk (jitted)."""
    return cached("baseline", run, lambda: _make_baseline(run))


def _make_baseline(run):
    d = run.spec.d_model
    L = run.depth

    def fn(params, tokens_bt):
        active = jnp.ones((L,), bool)
        order = jnp.arange(L, dtype=jnp.int32)
        logits, cap = run.forward(params, tokens_bt, active, order, capture=CAPTURES)
        z = cap["z"]
        ce, kl, top = _lens_sums(cap["lens_logits"], logits, tokens_bt)
        out = {"nll": nll_sum(logits, tokens_bt), "lens_ce": ce, "lens_kl": kl, "lens_top": top,
               "angular": _angular_sum(z),
               "svals": jnp.linalg.svd(z.astype(jnp.float32), compute_uv=False),
               "probe": cap["probe"]}
        if z.shape[-1] > d:  # several streams side by side (static)
            cos, svals = _streams(z, d)
            out["stream_cos"] = cos
            out["stream_erank"] = jnp.sum(_effective_rank(svals), axis=(1, 2))
        return out, z

    return run.jit(fn, 1, 0)


def make_skip(run):
    """``(params, tokens, z_base, actives [K, L]) -> (num [K, L], den [L],
    ratio [K, L], nll [K])``: causal-score sums and losses of ``K`` skips."""
    return cached("skip", run, lambda: _make_skip(run))


def _make_skip(run):
    L = run.depth

    def fn(params, tokens_bt, z_base, actives_kl):
        order = jnp.arange(L, dtype=jnp.int32)
        u = jnp.diff(z_base.astype(jnp.float32), axis=0)  # [L, B, T, D]
        u_norm = jnp.linalg.norm(u, axis=-1)

        def one(active):
            logits, cap = run.forward(params, tokens_bt, active, order, capture=("z",))
            z = cap["z"]
            diff = jnp.linalg.norm(jnp.diff(z.astype(jnp.float32), axis=0) - u, axis=-1)
            ratio = jnp.where(u_norm > 1e-8, diff / jnp.where(u_norm > 0, u_norm, 1.0), 0.0)
            return jnp.sum(diff, axis=(1, 2)), jnp.sum(ratio, axis=(1, 2)), nll_sum(logits,
                                                                                    tokens_bt)

        num, ratio, nll = jax.vmap(one)(actives_kl)
        return num, jnp.sum(u_norm, axis=(1, 2)), ratio, nll

    return run.jit(fn, 1, 2)


def make_swap(run):
    """``(params, tokens, orders [K, L]) -> nll [K]`` for ``K`` permutations."""
    return cached("swap", run, lambda: _make_swap(run))


def _make_swap(run):
    L = run.depth

    def fn(params, tokens_bt, orders_kl):
        active = jnp.ones((L,), bool)
        return jax.vmap(lambda o: nll_sum(run.forward(params, tokens_bt, active, o)[0],
                                          tokens_bt))(orders_kl)

    return run.jit(fn, 1, 1)


def _effective_rank(s):
    """``exp(H(s^2 / sum s^2))`` over the last axis, on device (1 for all-zero s)."""
    s2 = jnp.square(s.astype(jnp.float32))
    total = jnp.sum(s2, axis=-1, keepdims=True)
    p = jnp.clip(s2 / jnp.maximum(total, 1e-30), 1e-12, None)
    return jnp.where(total[..., 0] < 1e-12, 1.0, jnp.exp(-jnp.sum(p * jnp.log(p), axis=-1)))


def spectra(svals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample stable and effective ranks, averaged over the sample axis 1."""
    return stable_rank(svals).mean(axis=1), effective_rank(svals).mean(axis=1)


def chunks(n: int, size: int):
    """``range(n)`` in consecutive slices of at most ``size``."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]
