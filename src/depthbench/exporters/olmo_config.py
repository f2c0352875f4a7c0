"""A run's config as the original DepthBench's ``config.json`` (an OLMo-core experiment config).

The inverse of :mod:`depthbench.importers.olmo_config`: ``model`` is a
``TransformerConfig`` dict, the LLaMA backbone every design shares written
here (attention, RoPE, SwiGLU, norms, LM head, with the ``_CLASS_`` tags
OLMo-core's ``Config.from_dict`` builds it from) and ``model.block`` completed
by the family's own part (``to_original``: its block name and fields) and what
its blocks need beside the block (``original_model``: MoDA's last-block
override).  ``dataset`` carries the sequence length and the tokenizer's ids;
``train_module.optim`` the run's AdamW settings (a family's reading may look
there: CompleteP tells depth-only runs from depth-width ones by its
overrides, and an export writes none).

:func:`check_reads_back` reads the written config with the importer and
refuses an export whose block config would come back as another model.
"""

from __future__ import annotations

from typing import Any

from depthbench.errors import ConfigError

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


def model_section(config, family) -> dict[str, Any]:
    """config.json's ``model`` for ``config``'s model (``family``: its instance, an
    OriginalFormat); ConfigError (the family's line) when the original has no
    block computing it."""
    m = config.model
    attention = {"name": "default", "n_heads": int(m.n_heads), "n_kv_heads": int(m.n_kv_heads),
                 "bias": False, "dtype": "float32", "_CLASS_": _CLASSES["attention"],
                 "rope": {"name": "default", "theta": _number(m.rope_theta),
                          "full_precision": True, "_CLASS_": _CLASSES["rope"]}}
    block = {"sequence_mixer": attention,
             "layer_norm": _norm(family.original_norm, m.norm_eps),
             "feed_forward": {"hidden_size": int(m.d_ff), "name": "default", "bias": False,
                              "dtype": "float32", "activation": "silu",
                              "_CLASS_": _CLASSES["feed_forward"]},
             "_CLASS_": _CLASSES["block"], **family.to_original()}
    return {"d_model": int(m.d_model), "vocab_size": int(m.vocab_size), "n_layers": int(m.depth),
            "block": block,
            "lm_head": {"name": "default", "layer_norm": _norm("rms", m.norm_eps), "bias": False,
                        "dtype": "float32", "_CLASS_": _CLASSES["lm_head"]},
            "name": "default", "dtype": "float32", "init_method": "normal", "init_seed": 0,
            "init_std": float(m.init_std), "tie_word_embeddings": False,
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
        "model": model_section(config, family),
        "dataset": {"sequence_length": int(t.seq_len),
                    "tokenizer": {"vocab_size": int(config.model.vocab_size),
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


def check_reads_back(saved: dict, config, family, command: str) -> None:
    """The importer's reading of ``saved`` is the run's model: the same family and
    family fields, shape and numerics; ConfigError naming what would change."""
    from depthbench.importers.olmo_config import read_model

    model = read_model(saved)
    m = config.model
    if model.family != m.family:
        raise ConfigError(f"{command}: the block config written reads back as {model.family}, "
                          f"not {m.family}")
    for key, value in model.model_fields.items():
        if float(value) != float(m[key]):
            raise ConfigError(f"{command}: model.{key} = {m[key]} reads back as {value}")
    again = type(family.cfg).from_fields(model.reading.residual, m.family).as_dict()
    for key, value in family.cfg.as_dict().items():
        if again[key] != value:
            raise ConfigError(f"{command}: the original's {model.block!r} block cannot carry "
                              f"model.residual.{key} = {value!r} (it reads back as "
                              f"{again[key]!r})")
