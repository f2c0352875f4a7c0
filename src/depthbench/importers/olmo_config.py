"""The original DepthBench's ``config.json`` as a depthbench family and its fields.

A released step directory carries the OLMo-core experiment config its
trainer saved (``model``: the ``TransformerConfig``; ``dataset.tokenizer``:
the token ids).  :func:`read_model` turns its ``model`` section into an
:class:`OlmoModel`: the family whose block config it is, the backbone's
explicit shape and numerics (read here: every design shares the LLaMA
backbone), and the family's own reading of its block (each family's
``from_original``, model/residual/protocol/original_format.py): its fields, the
training rule it trained with, the *departures* (what a field cannot carry,
listed) and a form config.json does not decide (said).

The block types the original trained are those the registered families
claim (docs/ORIGINAL.md has the table); any other type, or another family's
field on a block, is one line naming it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from depthbench.errors import ConfigError
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.original_format import Fields, OriginalFormat, Reading

WHAT = "import-olmo"


@dataclasses.dataclass(frozen=True)
class OlmoModel:
    """What ``config.json``'s model section means for depthbench."""

    family: str
    model_fields: dict[str, Any]  # depth, d_model, d_ff, n_heads, n_kv_heads, vocab, eps, theta
    reading: Reading  # the family's: its fields, train rule, departures, choice, block type
    tied: bool  # the LM head is the embedding

    @property
    def block(self) -> str:
        return self.reading.block


def read_config(step_dir: Path) -> dict:
    """``step_dir/config.json`` as a dict (ConfigError if missing or not JSON)."""
    from depthbench.importers.run_writer import read_source_config

    saved = read_source_config(step_dir, WHAT, "an OLMo-core step directory with config.json "
                               "and model_and_optim/")
    if isinstance(saved.get("model"), dict) and "family" in saved["model"]:
        raise ConfigError(f"{WHAT}: {step_dir} is a depthbench run directory (its config.json "
                          "names model.family), not an OLMo-core checkpoint: it needs no "
                          "import")
    if not isinstance(saved.get("model"), dict):
        raise ConfigError(f"{WHAT}: {step_dir / 'config.json'} has no 'model' section (an "
                          "OLMo-core experiment config saves the TransformerConfig there)")
    return saved


def _backbone(model: Fields, block: Fields) -> dict[str, Any]:
    """Shape and numerics of the LLaMA backbone every design shares."""
    d = model.int("d_model")
    attn = block.sub("sequence_mixer", "attention")
    if attn.opt("name") not in (None, "default", "fused"):
        raise ConfigError(f"{WHAT}: config.json: {attn.where}.name {attn.opt('name')!r} is not "
                          "supported; allowed: default (softmax attention)")
    n = attn.int("n_heads")
    kv = attn.int("n_kv_heads", default=n)
    for name in ("bias", "qk_norm", "clip_qkv", "window_size", "gate"):
        attn.refuse(name, why="the backbone is a plain LLaMA attention")
    if attn.opt("head_dim") not in (None, d // n) or d % n or n % kv:
        raise ConfigError(f"{WHAT}: config.json: {attn.where}: heads {n}/{kv} kv with head_dim "
                          f"{attn.opt('head_dim')} do not fit d_model {d} (want head_dim = "
                          "d_model / n_heads and n_kv_heads dividing n_heads)")
    rope = attn.sub("rope")
    rope.choice("name", ("default", "fused"), "default")
    for name in ("scaling", "partial_rotary_factor"):
        rope.refuse(name, allowed=(None, 1.0), why="only unscaled, full RoPE")
    ff = block.sub("feed_forward")
    ff.refuse("bias", why="the MLP has no biases")
    ff.choice("activation", ("silu",), "silu")
    ff.choice("name", ("default",), "default")
    norm = block.sub("layer_norm")
    norm.refuse("bias", why="norms without bias")
    head_norm = model.sub("lm_head").sub("layer_norm")
    eps = norm.num("eps", 1e-5)
    if head_norm.num("eps", 1e-5) != eps:
        raise ConfigError(f"{WHAT}: config.json: model.lm_head.layer_norm.eps "
                          f"{head_norm.num('eps', 1e-5)} differs from the blocks' {eps}; "
                          "depthbench has one norm_eps")
    head_norm.choice("name", ("rms", "fused_rms"), "rms")
    model.sub("lm_head").refuse("bias", why="the LM head has no bias")
    return {"depth": model.int("n_layers"), "d_model": d,
            "d_ff": ff.int("hidden_size"), "n_heads": n, "n_kv_heads": kv,
            "vocab_size": model.int("vocab_size"), "norm_eps": eps,
            "rope_theta": rope.num("theta", 500_000.0)}


def original_families() -> list[type[OriginalFormat]]:
    """The registered families the original trained, in registry order."""
    return [cls for cls in registry.FAMILIES.values() if issubclass(cls, OriginalFormat)]


def _claimant(block: dict) -> type[OriginalFormat]:
    """The family whose block config ``block`` is: the one that claims it; where
    two do (a legacy ``default`` block carrying HC or AttnRes settings), the one
    that reads a field the block sets."""
    families = original_families()
    claims = [cls for cls in families if cls.original_claims(block)]
    if len(claims) > 1:
        claims = [cls for cls in claims if any(block.get(k) not in neutral for k, neutral in
                                               cls.original_fields.items())]
    if len(claims) != 1:
        name = block.get("name") or "default"
        if claims:  # two families read the same config: a registry bug, not bad input
            raise AssertionError(f"{[c.name for c in claims]} all claim block {name!r}")
        known = sorted({b for cls in families for b in cls.original_blocks})
        raise ConfigError(f"{WHAT}: config.json: model.block.name {name!r} is not a design the "
                          f"original trained; allowed: {', '.join(known)}")
    return claims[0]


def read_model(saved: dict, options: dict[str, str] | None = None) -> OlmoModel:
    """The depthbench reading of ``saved["model"]`` (ConfigError: one line);
    ``options``: the import's choices a family reads (``hc_form``)."""
    model = Fields(saved["model"], "model")
    if model.opt("name") not in (None, "default"):
        raise ConfigError(f"{WHAT}: config.json: model.name {model.opt('name')!r} is not "
                          "supported; allowed: default")
    for name in ("embedding_norm", "embed_scale", "block_pattern", "float8_config"):
        model.refuse(name)
    block_raw = model.data.get("block")
    if not isinstance(block_raw, dict):
        raise ConfigError(f"{WHAT}: config.json: model.block must be one block config "
                          "(named block dicts are not supported)")
    block = Fields(block_raw, "model.block")
    fields = _backbone(model, block)
    block.refuse("dropout", allowed=(None, 0, 0.0))
    cls = _claimant(block_raw)
    name = block_raw.get("name") or "default"
    for other in original_families():  # another family's settings on this block
        for key, neutral in other.original_fields.items():
            if key not in cls.original_fields and key != "block_overrides":
                block.refuse(key, allowed=neutral, why=f"{other.name}'s setting on a {name!r} "
                             "block")
    if model.opt("block_overrides") and "block_overrides" not in cls.original_fields:
        raise ConfigError(f"{WHAT}: config.json: model.block_overrides is not supported for a "
                          f"{name!r} block")
    norm_name = block.sub("layer_norm").opt("name") or "rms"
    if norm_name not in ({cls.original_norm, "fused_rms"} if cls.original_norm == "rms" else
                         {cls.original_norm}):
        raise ConfigError(f"{WHAT}: config.json: model.block.layer_norm.name {norm_name!r}: a "
                          f"{name!r} block needs {cls.original_norm!r}")
    reading = cls.from_original(block, saved, options or {})
    return OlmoModel(family=cls.name, model_fields=fields, reading=reading,
                     tied=bool(model.opt("tie_word_embeddings")))
