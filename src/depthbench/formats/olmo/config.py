"""The original DepthBench's ``config.json``, both ways: read as a family, written from a run.

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

Written (:func:`experiment_config`): ``model`` is a ``TransformerConfig``
dict, the shared backbone with the ``_CLASS_`` tags OLMo-core's
``Config.from_dict`` builds it from, and ``model.block`` completed by the
family's own part (``to_original``; ``original_model``: what its blocks need
beside the block); ``dataset`` carries the sequence length and the
tokenizer's ids, ``train_module.optim`` the run's AdamW settings.
:func:`check_reads_back` reads the written config with :func:`read_model`
and refuses an export whose block config would come back as another model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from depthbench.errors import ConfigError
from depthbench.formats.run_writer import read_source_config
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


def import_options() -> dict[str, tuple[tuple[str, ...], str, str]]:
    """The options an import takes (``--option``): those the original families
    declare (``OriginalFormat.original_options``), each once."""
    out: dict[str, tuple[tuple[str, ...], str, str]] = {}
    for cls in original_families():
        for name, declared in cls.original_options.items():
            if out.setdefault(name, declared) != declared:  # a registry bug, not bad input
                raise AssertionError(f"{cls.name} declares import option {name!r} otherwise")
    return out


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
    ``options``: the import's choices a family reads (:func:`import_options`)."""
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
    allowed = {cls.original_norm, "fused_rms"} if cls.original_norm == "rms" else {
        cls.original_norm}
    if not isinstance(norm_name, str) or norm_name not in allowed:
        raise ConfigError(f"{WHAT}: config.json: model.block.layer_norm.name {norm_name!r}: a "
                          f"{name!r} block needs {cls.original_norm!r}")
    reading = cls.from_original(block, saved, options or {})
    return OlmoModel(family=cls.name, model_fields=fields, reading=reading,
                     tied=bool(model.opt("tie_word_embeddings")))


# ------------------------------------------------------------------ written

OLMO = "olmo_core"
_CLASSES = {
    "model": f"{OLMO}.nn.transformer.config.TransformerConfig",
    "block": f"{OLMO}.nn.transformer.config.TransformerBlockConfig",
    "attention": f"{OLMO}.nn.attention.AttentionConfig",
    "rope": f"{OLMO}.nn.rope.RoPEConfig",
    "norm": f"{OLMO}.nn.layer_norm.LayerNormConfig",
    "feed_forward": f"{OLMO}.nn.feed_forward.FeedForwardConfig",
    "lm_head": f"{OLMO}.nn.lm_head.LMHeadConfig",
    "tokenizer": f"{OLMO}.data.tokenizer.TokenizerConfig",
    "adamw": f"{OLMO}.optim.adamw.AdamWConfig",
}


def _number(x: float) -> int | float:
    """An integral value as an int (RoPE's theta is an int in OLMo-core's config)."""
    return int(x) if float(x).is_integer() else float(x)


def _norm(name: str, eps: float) -> dict[str, Any]:
    return {"name": name, "eps": float(eps), "bias": False, "dtype": "float32",
            "_CLASS_": _CLASSES["norm"]}


def model_section(family) -> dict[str, Any]:
    """config.json's ``model`` for ``family``'s model (an OriginalFormat instance,
    whose spec holds the complete shape and numerics); ConfigError (the
    family's line) when the original has no block computing it."""
    s = family.spec
    attention = {"name": "default", "n_heads": s.n_heads, "n_kv_heads": s.n_kv_heads,
                 "bias": False, "dtype": "float32", "_CLASS_": _CLASSES["attention"],
                 "rope": {"name": "default", "theta": _number(s.rope_theta),
                          "full_precision": True, "_CLASS_": _CLASSES["rope"]}}
    block = {"sequence_mixer": attention,
             "layer_norm": _norm(family.original_norm, s.norm_eps),
             "feed_forward": {"hidden_size": s.d_ff, "name": "default", "bias": False,
                              "dtype": "float32", "activation": "silu",
                              "_CLASS_": _CLASSES["feed_forward"]},
             "_CLASS_": _CLASSES["block"], **family.to_original()}
    return {"d_model": s.d_model, "vocab_size": s.vocab_size, "n_layers": s.depth,
            "block": block,
            "lm_head": {"name": "default", "layer_norm": _norm("rms", s.norm_eps), "bias": False,
                        "dtype": "float32", "_CLASS_": _CLASSES["lm_head"]},
            "name": "default", "dtype": "float32", "init_method": "normal", "init_seed": 0,
            "init_std": float(s.init_std), "tie_word_embeddings": False,
            "_CLASS_": _CLASSES["model"], **family.original_model(block)}


def _token_id(tokenizer: dict, key: str) -> int | None:
    value = int(tokenizer.get(key, -1))
    return None if value < 0 else value


def experiment_config(config, resolved: dict, family) -> dict[str, Any]:
    """The whole config.json of an export of the run (``resolved``: its config.json's
    ``resolved`` block, for the tokenizer's ids)."""
    t = config.train
    tok = resolved.get("tokenizer") or {}
    return {
        "model": model_section(family),
        "dataset": {"sequence_length": int(t.seq_len),
                    "tokenizer": {"vocab_size": family.spec.vocab_size,
                                  "eos_token_id": _token_id(tok, "eos_id"),
                                  "pad_token_id": _token_id(tok, "pad_id"),
                                  "bos_token_id": _token_id(tok, "bos_id"),
                                  "identifier": tok.get("tokenizer_path") or None,
                                  "_CLASS_": _CLASSES["tokenizer"]}},
        "train_module": {"max_sequence_length": int(t.seq_len),
                         "max_grad_norm": float(t.clip_norm),
                         "optim": {"lr": float(t.lr), "betas": [float(t.b1), float(t.b2)],
                                   "eps": float(t.eps), "weight_decay": float(t.weight_decay),
                                   "_CLASS_": _CLASSES["adamw"]}},
    }


def check_reads_back(saved: dict, family, command: str) -> None:
    """The importer's reading of ``saved`` is ``family``'s model: the same family
    and family fields, shape and numerics; ConfigError naming what would change."""
    model = read_model(saved)
    s = family.spec
    if model.family != s.family:
        raise ConfigError(f"{command}: the block config written reads back as {model.family}, "
                          f"not {s.family}")
    for key, value in model.model_fields.items():
        if float(value) != float(getattr(s, key)):
            raise ConfigError(f"{command}: model.{key} = {getattr(s, key)} reads back as {value}")
    again = type(family.cfg).from_fields(model.reading.residual, s.family).as_dict()
    for key, value in family.cfg.as_dict().items():
        if again[key] != value:
            raise ConfigError(f"{command}: the original's {model.block!r} block cannot carry "
                              f"model.residual.{key} = {value!r} (it reads back as "
                              f"{again[key]!r})")
