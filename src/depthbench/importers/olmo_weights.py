"""Where each tensor of an original DepthBench checkpoint goes in depthbench's parameters.

:func:`placements` lists, for the model :mod:`olmo_config` read, every
checkpoint key the design has, its shape, and where it lands: a leaf of
depthbench's parameter tree, an index into it (blocks are stacked on a
leading axis; hc/mhc connectors on a second one, 0 = attention, 1 = MLP)
and a conversion.  torch ``Linear`` weights are ``[out, in]``, depthbench's
``[in, out]``, with attention heads split out::

    attention.w_q / w_k / w_v [heads*h, d]  -> attn/q, k, v [d, heads, h]
    attention.w_out [d, n*h]                -> attn/o [n, h, d]
    feed_forward.w1 / w3 [f, d] (gate, up)  -> mlp/gate, up [d, f]
    feed_forward.w2 [d, f] (down)           -> mlp/down [f, d]
    embeddings.weight [V, d]                -> embed [V, d]
    lm_head.w_out.weight [V, d]             -> head [d, V]
    lm_head.norm.weight                     -> final_norm/scale

and each design's own tensors (docs/ORIGINAL.md has the table).  Entries
without a checkpoint key are constants (the norm of keel's block 0 that the
original does not have, AttnRes's unused block-0 attention query, MoDA's
skipped last depth projection).  :func:`convert` streams the checkpoint
through the list into preallocated host arrays, one tensor at a time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from depthbench.errors import ConfigError
from depthbench.importers.olmo_config import WHAT, OlmoModel

Index = tuple  # ints and slices into a leaf


@dataclasses.dataclass(frozen=True)
class Placement:
    leaf: tuple[str, ...]  # path in the parameter tree
    index: Index
    convert: Callable[[np.ndarray], np.ndarray] | None = None  # None: as is
    value: float | None = None  # a constant (no checkpoint key)


# Each block's two connectors and their index on depthbench's connector axis.
_CONNECTORS = (("attention_hyper_connection", 0), ("feed_forward_hyper_connection", 1))


def placements(m: OlmoModel) -> tuple[dict[str, tuple[tuple[int, ...], list[Placement]]],
                                      list[Placement]]:
    """``({checkpoint key: (its shape, [placements])}, [constant placements])``."""
    f = m.model_fields
    L, d, n, kv, ff, V = (f["depth"], f["d_model"], f["n_heads"], f["n_kv_heads"], f["d_ff"],
                          f["vocab_size"])
    h = d // n
    keys: dict[str, tuple[tuple[int, ...], list[Placement]]] = {}
    consts: list[Placement] = []

    def put(key, shape, leaf, index=(), convert=None):
        keys.setdefault(key, (tuple(shape), []))[1].append(
            Placement(tuple(leaf.split("/")), index, convert))

    def const(leaf, index, value):
        consts.append(Placement(tuple(leaf.split("/")), index, value=value))

    moda = m.family == "moda"
    attn, mlp = ("attention.attention.", "feed_forward.feed_forward.") if moda else (
        "attention.", "feed_forward.")
    norms = _norm_leaves(m)
    for i in range(L):
        b = f"blocks.{i}."
        put(b + attn + "w_q.weight", (n * h, d), "blocks/attn/q", (i,),
            lambda w: w.T.reshape(d, n, h))
        put(b + attn + "w_k.weight", (kv * h, d), "blocks/attn/k", (i,),
            lambda w: w.T.reshape(d, kv, h))
        put(b + attn + "w_v.weight", (kv * h, d), "blocks/attn/v", (i,),
            lambda w: w.T.reshape(d, kv, h))
        put(b + attn + "w_out.weight", (d, n * h), "blocks/attn/o", (i,),
            lambda w: w.T.reshape(n, h, d))
        put(b + mlp + "w1.weight", (ff, d), "blocks/mlp/gate", (i,), np.transpose)
        put(b + mlp + "w3.weight", (ff, d), "blocks/mlp/up", (i,), np.transpose)
        put(b + mlp + "w2.weight", (d, ff), "blocks/mlp/down", (i,), np.transpose)
        for name, leaf in norms.items():
            if m.family == "keel" and name == "post_attention_norm" and i == 0:
                const(leaf, (0,), 1.0)  # the original's block 0 has no N_pa (unused here)
            else:
                put(b + name + ".weight", (d,), leaf, (i,))
        _family_block(m, i, put, const)
    put("embeddings.weight", (V, d), "embed")
    put("embeddings.weight" if m.layout.get("tied") else "lm_head.w_out.weight", (V, d), "head",
        (), np.transpose)
    put("lm_head.norm.weight", (d,), "final_norm/scale")
    if m.family.startswith("attnres"):
        put("res_proj.weight", (1, d), "residual/query", (), lambda w: w[0])
        put("res_norm.weight", (d,), "residual/key_norm")
    return keys, consts


def _norm_leaves(m: OlmoModel) -> dict[str, str]:
    """The original's per-block norm names -> depthbench leaves."""
    pre = {"attention_norm": "blocks/attn_norm", "feed_forward_norm": "blocks/mlp_norm"}
    post = {"attention_norm": "blocks/residual/attn_post_norm",
            "feed_forward_norm": "blocks/residual/mlp_post_norm"}
    if m.family == "sandwich_ln":
        return {**pre, "post_attention_norm": "blocks/residual/attn_post_norm",
                "post_feed_forward_norm": "blocks/residual/mlp_post_norm"}
    if m.family == "keel":
        return {**pre, "post_attention_norm": "blocks/residual/attn_post_norm",
                "post_feed_forward_norm": "blocks/residual/mlp_post_norm"}
    if m.family == "deepnorm":
        return {"attention_norm": "blocks/residual/attn_post_ln",
                "feed_forward_norm": "blocks/residual/mlp_post_ln"}
    if m.family == "post_ln" or (m.family == "moda" and m.residual["moda_norm"] == "post"):
        return post
    return pre


def _family_block(m: OlmoModel, i: int, put, const) -> None:
    """Block ``i``'s design-specific tensors."""
    f = m.model_fields
    d, kv, h, L = f["d_model"], f["n_kv_heads"], f["d_model"] // f["n_heads"], f["depth"]
    b = f"blocks.{i}."
    if m.family == "hc":
        n = m.layout["streams"]
        for conn, sub in _CONNECTORS:
            c = f"{b}{conn}."
            put(c + "static_alpha", (n, n + 1), "blocks/residual/A0", (i, sub))
            put(c + "dynamic_alpha_proj", (d, n + 1), "blocks/residual/W_a", (i, sub))
            put(c + "dynamic_alpha_scale", (), "blocks/residual/s_a", (i, sub))
            put(c + "static_beta", (n,), "blocks/residual/beta0", (i, sub))
            put(c + "dynamic_beta_proj", (d,), "blocks/residual/w_b", (i, sub))
            put(c + "dynamic_beta_scale", (), "blocks/residual/s_b", (i, sub))
    elif m.family == "mhc":
        n = m.layout["streams"]
        width = n * n + 2 * n
        for conn, sub in _CONNECTORS:
            c = f"{b}{conn}."
            if m.layout["hc_kind"] == "liger_mhc":
                _liger_connector(c, i, sub, n, d, width, put)
                continue
            # PyTorch mHC: three projections, stream-major rows (s*d + c) like depthbench's
            # phi [n, d, m]; its residual columns are already [in, out] (einsum "st,sd->td").
            for key, cols in (("pre_dynamic_proj", slice(0, n)),
                              ("post_dynamic_proj", slice(n, 2 * n)),
                              ("residual_dynamic_proj", slice(2 * n, width))):
                span = cols.stop - cols.start
                put(c + key, (n * d, span), "blocks/residual/phi",
                    (i, sub, slice(None), slice(None), cols),
                    lambda w, span=span: w.reshape(n, d, span))
            put(c + "pre_bias", (n,), "blocks/residual/b_pre", (i, sub))
            put(c + "post_bias", (n,), "blocks/residual/b_post", (i, sub))
            put(c + "residual_bias", (n, n), "blocks/residual/B_res", (i, sub))
            put(c + "pre_gate", (), "blocks/residual/a_pre", (i, sub))
            put(c + "post_gate", (), "blocks/residual/a_post", (i, sub))
            put(c + "residual_gate", (), "blocks/residual/a_res", (i, sub))
    elif m.family.startswith("attnres"):
        if i == 0:  # the first sublayer reads the embedding alone: no query, no key norm
            const("blocks/residual/query", (0, 0), 0.0)
            const("blocks/residual/key_norm", (0, 0), 1.0)
        else:
            put(b + "attn_res_proj.weight", (1, d), "blocks/residual/query", (i, 0),
                lambda w: w[0])
            put(b + "attn_res_norm.weight", (d,), "blocks/residual/key_norm", (i, 0))
        put(b + "mlp_res_proj.weight", (1, d), "blocks/residual/query", (i, 1), lambda w: w[0])
        put(b + "mlp_res_norm.weight", (d,), "blocks/residual/key_norm", (i, 1))
    elif m.family == "moda":
        if i == L - 1:  # configure_moda skips the last block's FFN depth K/V (nothing reads it)
            const("blocks/residual/depth_kv", (i,), 0.0)
        else:
            # kv_proj(x).view(B, T, 2, n_kv, h): rows are (k|v, head, h)
            put(b + "feed_forward.kv_proj.weight", (2 * kv * h, d), "blocks/residual/depth_kv",
                (i,), lambda w: w.T.reshape(d, 2, kv, h))


def _liger_connector(c: str, i: int, sub: int, n: int, d: int, width: int, put) -> None:
    """Liger mHC: ``phi [n*d, n^2 + 2n]`` (columns pre | post | res, rows
    stream-major like depthbench's ``phi [n, d, m]``) and ``b [n^2 + 2n]`` in the
    same order; the res part row-major ``[out, in]``, as depthbench's
    ``mhc_res_layout = "out_in"`` reads it (no transpose)."""
    put(c + "phi", (n * d, width), "blocks/residual/phi", (i, sub),
        lambda w: w.reshape(n, d, width))
    put(c + "b", (width,), "blocks/residual/b_pre", (i, sub), lambda b: b[:n])
    put(c + "b", (width,), "blocks/residual/b_post", (i, sub), lambda b: b[n:2 * n])
    put(c + "b", (width,), "blocks/residual/B_res", (i, sub), lambda b: b[2 * n:].reshape(n, n))
    put(c + "alpha_pre", (), "blocks/residual/a_pre", (i, sub))
    put(c + "alpha_post", (), "blocks/residual/a_post", (i, sub))
    put(c + "alpha_res", (), "blocks/residual/a_res", (i, sub))


def ignored(key: str) -> bool:
    """Checkpoint entries that are not weights of their own: the HC/mHC branch
    modules' aliases of the block's attention, MLP and norms, and LNS's constant
    ``ln_scale`` buffer (``1/sqrt(i+1)``, recomputed by depthbench)."""
    return ".branch." in key or key.endswith(".ln_scale")


def _leaf(tree: dict, path: tuple[str, ...]) -> np.ndarray:
    for name in path:
        tree = tree[name]
    return tree


def convert(read: Callable[[str], np.ndarray], present: dict[str, tuple[int, ...]],
            m: OlmoModel, shapes: dict, *, block: str, progress: bool = False) -> dict:
    """depthbench's parameter tree (host arrays of ``shapes``' ``(shape, dtype)``
    leaves: fp32, bf16 where the family stores bf16) filled from the checkpoint
    (``present``: its model keys and shapes; ``read``: one tensor by key).
    Every key of the design must be present with its shape, every present key
    must be one of them, every parameter filled."""
    from tqdm import tqdm

    keys, consts = placements(m)
    unexpected = sorted(k for k in present if k not in keys and not ignored(k))
    if unexpected:
        raise ConfigError(f"{WHAT}: checkpoint tensor model.{unexpected[0]} is not part of a "
                          f"{block!r} model as config.json describes it "
                          f"({len(unexpected)} such tensor(s))")
    missing = sorted(k for k in keys if k not in present)
    if missing:
        raise ConfigError(f"{WHAT}: checkpoint lacks tensor model.{missing[0]} that a "
                          f"{block!r} model has ({len(missing)} missing)")
    for key, (shape, _) in keys.items():
        if tuple(present[key]) != shape:
            raise ConfigError(f"{WHAT}: checkpoint tensor model.{key} has shape "
                              f"{tuple(present[key])}, config.json implies {shape}")

    def alloc(node):
        if isinstance(node, dict):
            return {k: alloc(v) for k, v in node.items()}
        shape, dtype = node
        return np.zeros(shape, dtype)

    tree = alloc(shapes)
    filled: dict[tuple[str, ...], int] = {}

    def place(p: Placement, x: Any) -> None:
        target = _leaf(tree, p.leaf)
        view = target[p.index] if p.index else target
        if np.shape(x) != view.shape:  # a mapping bug, not bad input
            raise AssertionError(f"{p.leaf}{p.index}: {np.shape(x)} into {view.shape}")
        if p.index:
            target[p.index] = x
        else:
            target[...] = x
        filled[p.leaf] = filled.get(p.leaf, 0) + view.size

    for p in consts:
        place(p, np.full(_leaf(tree, p.leaf)[p.index].shape, p.value, np.float32))
    for key in tqdm(list(keys), desc="converting", unit="tensor", disable=not progress):
        x = read(key)  # stored dtype; the assignment into the leaf converts
        for p in keys[key][1]:
            place(p, p.convert(x) if p.convert else x)
        del x

    def check(node, path=()):
        if isinstance(node, dict):
            for k, v in node.items():
                check(v, (*path, k))
        elif filled.get(path, 0) != node.size:  # a mapping bug: a parameter left unset
            raise AssertionError(f"{'/'.join(path)}: {filled.get(path, 0)} of {node.size} set")

    check(tree)
    return tree
