"""Where each tensor of an original DepthBench checkpoint goes in depthbench's parameters, and back.

:func:`tensors` lists, for a family instance, every checkpoint key its model
has, its shape, and where it lands (a ``Tensor`` of
:mod:`~depthbench.model.residual.protocol.original_format`: a leaf of
depthbench's parameter tree, an index into it, a conversion and its inverse),
and the parameters the original does not have (constants).  The
LLaMA backbone is mapped here, for every family alike; torch ``Linear``
weights are ``[out, in]``, depthbench's ``[in, out]``, with attention heads
split out::

    attention.w_q / w_k / w_v [heads*h, d]  -> attn/q, k, v [d, heads, h]
    attention.w_out [d, n*h]                -> attn/o [n, h, d]
    feed_forward.w1 / w3 [f, d] (gate, up)  -> mlp/gate, up [d, f]
    feed_forward.w2 [d, f] (down)           -> mlp/down [f, d]
    embeddings.weight [V, d]                -> embed [V, d]
    lm_head.w_out.weight [V, d]             -> head [d, V]
    lm_head.norm.weight                     -> final_norm/scale

(the sublayers under the family's module paths, ``original_sublayers``), and
each block's norms and the family's own tensors come from the family's file
(``OriginalFormat``; docs/ORIGINAL.md has the table).  :func:`convert`
streams a checkpoint through the list into preallocated host arrays, one
tensor at a time; :func:`export` runs it backwards, parameters to the
original's tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from depthbench.errors import ConfigError
from depthbench.formats.olmo.config import WHAT
from depthbench.model.residual.protocol.original_format import (
    Constant,
    OriginalFormat,
    Tensor,
    linear,
    vector,
)


def tensors(family: OriginalFormat, *, tied: bool = False) -> tuple[dict[str, Tensor],
                                                                    list[Constant]]:
    """``({checkpoint key: Tensor}, [constants])`` of ``family``'s model."""
    s = family.spec
    L, d, n, kv, ff, V, h = (s.depth, s.d_model, s.n_heads, s.n_kv_heads, s.d_ff, s.vocab_size,
                             s.head_dim)
    keys: dict[str, Tensor] = {}
    consts: list[Constant] = []

    def add(t: Tensor | Constant, prefix: str = "") -> None:
        if isinstance(t, Constant):
            consts.append(t)
        else:
            keys[prefix + t.key] = Tensor(prefix + t.key, t.shape, t.places, t.join)

    attn, mlp = family.original_sublayers
    for i in range(L):
        b = f"blocks.{i}."
        for name, heads, leaf in (("w_q", n, "q"), ("w_k", kv, "k"), ("w_v", kv, "v")):
            add(linear(f"{attn}{name}.weight", heads * h, d, f"blocks/attn/{leaf}", (i,),
                       (d, heads, h)), b)
        add(linear(f"{attn}w_out.weight", d, n * h, "blocks/attn/o", (i,), (n, h, d)), b)
        add(linear(f"{mlp}w1.weight", ff, d, "blocks/mlp/gate", (i,)), b)
        add(linear(f"{mlp}w3.weight", ff, d, "blocks/mlp/up", (i,)), b)
        add(linear(f"{mlp}w2.weight", d, ff, "blocks/mlp/down", (i,)), b)
        for name, leaf in family.original_norms(i).items():
            add(vector(f"{name}.weight", (d,), leaf, (i,)), b)
        for t in family.original_block_tensors(i):
            add(t, b)
    add(vector("embeddings.weight", (V, d), "embed"))
    head = linear("lm_head.w_out.weight", V, d, "head")
    if tied:  # the head is the embedding: one tensor, two leaves
        head = Tensor("embeddings.weight", (V, d), keys["embeddings.weight"].places + head.places)
    add(head)
    add(vector("lm_head.norm.weight", (d,), "final_norm/scale"))
    for t in family.original_global_tensors():
        add(t)
    return keys, consts


def ignored(family: OriginalFormat, key: str) -> bool:
    """Checkpoint entries that are not weights of their own (the family's
    ``original_ignored``: HC's branch aliases, LNS's ``ln_scale`` buffer)."""
    return any(part in key for part in family.original_ignored)


def _leaf(tree: dict, path: str) -> np.ndarray:
    for name in path.split("/"):
        tree = tree[name]
    return tree


def convert(read: Callable[[str], np.ndarray], present: dict[str, tuple[int, ...]],
            family: OriginalFormat, shapes: dict, *, block: str, tied: bool = False,
            progress: bool = False) -> dict:
    """depthbench's parameter tree (host arrays of ``shapes``' ``(shape, dtype)``
    leaves: fp32, bf16 where the family stores bf16) filled from the checkpoint
    (``present``: its model keys and shapes; ``read``: one tensor by key).
    Every key of the design must be present with its shape, every present key
    must be one of them, every parameter filled."""
    from tqdm import tqdm

    keys, consts = tensors(family, tied=tied)
    unexpected = sorted(k for k in present if k not in keys and not ignored(family, k))
    if unexpected:
        raise ConfigError(f"{WHAT}: checkpoint tensor model.{unexpected[0]} is not part of a "
                          f"{block!r} model as config.json describes it "
                          f"({len(unexpected)} such tensor(s))")
    missing = sorted(k for k in keys if k not in present)
    if missing:
        raise ConfigError(f"{WHAT}: checkpoint lacks tensor model.{missing[0]} that a "
                          f"{block!r} model has ({len(missing)} missing)")
    for key, t in keys.items():
        if tuple(present[key]) != t.shape:
            raise ConfigError(f"{WHAT}: checkpoint tensor model.{key} has shape "
                              f"{tuple(present[key])}, config.json implies {t.shape}")

    def alloc(node):
        if isinstance(node, dict):
            return {k: alloc(v) for k, v in node.items()}
        shape, dtype = node
        return np.zeros(shape, dtype)

    tree = alloc(shapes)
    filled: dict[str, int] = {}

    def place(leaf: str, index: tuple, x: Any) -> None:
        target = _leaf(tree, leaf)
        view = target[index] if index else target
        if np.shape(x) != view.shape:  # a mapping bug, not bad input
            raise AssertionError(f"{leaf}{index}: {np.shape(x)} into {view.shape}")
        if index:
            target[index] = x
        else:
            target[...] = x
        filled[leaf] = filled.get(leaf, 0) + view.size

    for c in consts:
        place(c.leaf, c.index, np.full(_leaf(tree, c.leaf)[c.index].shape, c.value, np.float32))
    for key in tqdm(list(keys), desc="converting", unit="tensor", disable=not progress):
        x = read(key)  # stored dtype; the assignment into the leaf converts
        for p in keys[key].places:
            place(p.leaf, p.index, p.to_ours(x) if p.to_ours else x)
        del x

    def check(node, path=()):
        if isinstance(node, dict):
            for k, v in node.items():
                check(v, (*path, k))
        elif filled.get("/".join(path), 0) != node.size:  # a mapping bug: a parameter unset
            raise AssertionError(f"{'/'.join(path)}: {filled.get('/'.join(path), 0)} of "
                                 f"{node.size} set")

    check(tree)
    return tree


def export(params: dict, family: OriginalFormat, *, tied: bool = False) -> dict[str, np.ndarray]:
    """The original's checkpoint tensors (keys without ``model.``) of depthbench's
    parameter tree ``params`` (host arrays), each in the leaf's dtype."""
    out = {}
    keys, _ = tensors(family, tied=tied)
    for key, t in keys.items():
        parts = []
        for p in t.places[:1] if tied and key == "embeddings.weight" else t.places:
            leaf = np.asarray(_leaf(params, p.leaf))
            x = leaf[p.index] if p.index else leaf
            parts.append(p.to_theirs(x) if p.to_theirs else x)
        out[key] = np.array(t.join(parts) if t.join else parts[0])  # (a copy, 0-d kept)
        if out[key].shape != t.shape:  # a mapping bug
            raise AssertionError(f"export {key}: {out[key].shape}, the original has {t.shape}")
    return out
