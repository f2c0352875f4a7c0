"""The original DepthBench's ``config.json`` as a depthbench family and its fields.

A released step directory carries the OLMo-core experiment config its
trainer saved (``model``: the ``TransformerConfig``; ``dataset.tokenizer``:
the token ids).  :func:`read_model` turns its ``model`` section into an
:class:`OlmoModel`: the depthbench family, the explicit shape and numerics,
the family's residual fields (by their current names: every choice the
original made is one, docs/ORIGINAL.md), what the weight mapping needs to
know about the layout, and the *departures*: what a field cannot carry
(only the training rules of depth-width muP runs), listed.

Block types the original trained (``model.block.name``; docs/ORIGINAL.md):
``default`` (pre_ln; also the early HC/mHC and AttnRes checkpoints, whose
connector rode on a default block), ``default_scaled`` (lns), ``peri_norm``
(sandwich_ln), ``deepnorm``, ``keel``, ``depth_mup``/``completep``
(completep), ``hc``, ``mhc`` (kinds ``mhc`` and ``liger_mhc``), ``attnres``
(attnres_full at block size 1, attnres_block above), ``moda`` /
``post_norm_moda`` (moda, pre/post norm) and ``post_norm`` (post_ln).  Any
other type or option is one line naming it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from depthbench.errors import ConfigError

WHAT = "import-olmo"
TRAINED = ("default", "default_scaled", "peri_norm", "deepnorm", "keel", "depth_mup",
           "completep", "hc", "mhc", "attnres", "moda", "post_norm_moda", "post_norm")
_PLAIN = {"default": "pre_ln", "default_scaled": "lns", "peri_norm": "sandwich_ln",
          "deepnorm": "deepnorm", "keel": "keel", "post_norm": "post_ln"}


@dataclasses.dataclass(frozen=True)
class OlmoModel:
    """What ``config.json``'s model section means for depthbench."""

    block: str  # the original's block type (after the legacy HC/AttnRes rewrite)
    family: str
    model_fields: dict[str, Any]  # depth, d_model, d_ff, n_heads, n_kv_heads, vocab, eps, theta
    residual: dict[str, Any]  # depthbench residual fields
    # Layout facts the weight mapping needs: hc_kind ("hc" | "mhc" | "liger_mhc"),
    # streams, attnres_size, moda_kv (extra FFN K/V projection present), tied
    # (head = embeddings).
    layout: dict[str, Any]
    departures: tuple[str, ...]  # what the imported run cannot reproduce (training rules)
    form: HCForm | None = None  # hc / PyTorch mHC: which of the original's forms, and why
    train: dict[str, Any] = dataclasses.field(default_factory=dict)  # the optimizer rule


HC_FORMS = ("auto", "final", "early")


@dataclasses.dataclass(frozen=True)
class HCForm:
    """Which of the original's two forms of HC and PyTorch mHC a checkpoint has
    (docs/ORIGINAL.md): ``final``, the mixed write rule and the streams summed
    before the head's norm (hyper_connections.py and model.py@8cc2fd74 on), or
    ``early``, the residual write rule and each stream through the head's norm
    (@dc75a4e to @5152cab; mHC's write rule did not change, only its readout).
    ``certain``: config.json says which; otherwise the import says what it chose."""

    form: str
    certain: bool
    why: str

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def hc_form(block: dict, kind: str, asked: str = "auto") -> HCForm:
    """The form of an hc or PyTorch mHC checkpoint from its ``model.block``
    (OLMo-core's config saver leaves out fields whose value is None), or the
    one ``asked`` (``--hc-form``).  What the fields of each era are
    (config.py's versions, read in the original's history):

    * HC on a ``default`` block: config.py before @5152cab: early;
    * ``moda_skip_ffn_kv`` saved: config.py@8cc2fd74 (MoDA's merge) or later: final;
    * ``hyper_connections.tanh`` saved for kind ``hc``: ``tanh: bool = True`` was
      always saved up to @5152cab (and @b2141085); from @2a9d668 it is None
      unless set, and the HC launcher never sets it: early;
    * ``tanh = true`` for kind ``mhc``: mHC's tanh default before @2a9d668: early;
    * anything else: checkpoints of @5152cab and of @2a9d668 to @8cc2fd74 save
      the same fields: the final form, said to be a choice."""
    hyper = block.get("hyper_connections") or {}
    if asked != "auto":
        return HCForm(asked, True, f"asked for with --hc-form {asked}")
    if (block.get("name") or "default") == "default":
        return HCForm("early", True, "HC on a 'default' block: config.py before @5152cab, "
                      "residual write rule, each stream through the head's norm")
    if "moda_skip_ffn_kv" in block:
        return HCForm("final", True, "model.block saves moda_skip_ffn_kv: config.py@8cc2fd74 "
                      "or later, mixed write rule, streams summed before the head's norm")
    if kind == "hc" and "tanh" in hyper:
        return HCForm("early", False, "hyper_connections.tanh is saved, as config.py saved "
                      "it up to @5152cab (the HC launcher never sets it later)")
    if kind == "mhc" and hyper.get("tanh") is True:
        return HCForm("early", False, "hyper_connections.tanh is true, mHC's default "
                      "before config.py@2a9d668")
    return HCForm("final", False, "config.json saves the same fields at @5152cab (early "
                  "form) and @2a9d668 to @8cc2fd74 (final form); chose the original's final "
                  "code")


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


class _Fields:
    """Typed reads of one config section, each failure one line naming the field."""

    def __init__(self, data: dict, where: str):
        self.data, self.where = data, where

    def sub(self, *names: str) -> _Fields:
        for name in names:
            value = self.data.get(name)
            if isinstance(value, dict):
                return _Fields(value, f"{self.where}.{name}")
        raise ConfigError(f"{WHAT}: config.json: {self.where}.{names[0]} is missing")

    def opt(self, name: str) -> Any:
        return self.data.get(name)

    def int(self, name: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.data.get(name, default)
        if value is None and default is not None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{WHAT}: config.json: {self.where}.{name} must be an integer "
                              f">= {minimum}, got {value!r}")
        return value

    def num(self, name: str, default: float) -> float:
        value = self.data.get(name, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value):
            raise ConfigError(f"{WHAT}: config.json: {self.where}.{name} must be a number, "
                              f"got {value!r}")
        return float(value)

    def refuse(self, name: str, allowed: tuple = (None, False), why: str = "") -> None:
        value = self.data.get(name)
        if value not in allowed:
            raise ConfigError(f"{WHAT}: config.json: {self.where}.{name} = {value!r} is not "
                              f"supported{': ' + why if why else ''}")

    def choice(self, name: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.data.get(name) or default
        if value not in allowed:
            raise ConfigError(f"{WHAT}: config.json: {self.where}.{name} {value!r} is not one of "
                              f"{', '.join(allowed)}")
        return value


def _backbone(model: _Fields, block: _Fields) -> dict[str, Any]:
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


def _block_overrides(model: _Fields, block: dict) -> bool:
    """Whether ``model.block_overrides`` is the MoDA last-block override (the only
    one the original used: ``moda_skip_ffn_kv`` on block L-1); anything else refuses."""
    overrides = model.opt("block_overrides") or {}
    if not overrides:
        return False
    last = str(model.int("n_layers") - 1)
    keys = {str(k) for k in overrides}
    ignore = {"moda_skip_ffn_kv", "_CLASS_"}
    same = all(isinstance(o, dict) and {k: v for k, v in o.items() if k not in ignore}
               == {k: v for k, v in block.items() if k not in ignore}
               for o in overrides.values())
    if keys != {last} or not same or not overrides.get(last, overrides.get(int(last), {})).get(
            "moda_skip_ffn_kv"):
        raise ConfigError(f"{WHAT}: config.json: model.block_overrides for blocks "
                          f"{sorted(keys)} is not supported (only the MoDA last-block override "
                          "moda_skip_ffn_kv)")
    return True


def _head_scale(saved: dict) -> float:
    """The LM-head output factor of the original's depth-width muP runs (its
    ``pretrain_preln_mup.py`` multiplies the head's output by ``d_base / d``, a
    patch config.json does not record), recovered from the embedding's AdamW
    epsilon override ``eps / m_N`` (m_N = d / d_base); 1 for depth-only runs."""
    optim = ((saved.get("train_module") or {}).get("optim") or {})
    base_eps = optim.get("eps")
    for group in optim.get("group_overrides") or []:
        if group.get("params") == ["embeddings.weight"] and "eps" in (group.get("opts") or {}):
            width_multiplier = float(base_eps) / float(group["opts"]["eps"])
            return 1.0 / width_multiplier
    return 1.0


def read_model(saved: dict, form: str = "auto") -> OlmoModel:
    """The depthbench reading of ``saved["model"]`` (ConfigError: one line);
    ``form``: hc and PyTorch mHC's form (:func:`hc_form`), ``auto`` from config.json."""
    model = _Fields(saved["model"], "model")
    if model.opt("name") not in (None, "default"):
        raise ConfigError(f"{WHAT}: config.json: model.name {model.opt('name')!r} is not "
                          "supported; allowed: default")
    for name in ("embedding_norm", "embed_scale", "block_pattern", "float8_config"):
        model.refuse(name)
    block_raw = model.data.get("block")
    if not isinstance(block_raw, dict):
        raise ConfigError(f"{WHAT}: config.json: model.block must be one block config "
                          "(named block dicts are not supported)")
    block = _Fields(block_raw, "model.block")
    fields = _backbone(model, block)
    moda_last_override = _block_overrides(model, block_raw)
    for name in ("dropout",):
        block.refuse(name, allowed=(None, 0, 0.0))
    name = block.opt("name") or "default"
    hyper = block.opt("hyper_connections")
    hc_form_of = None
    attnres_size = block.opt("attnres_block_size")
    if name == "default" and isinstance(hyper, dict):  # HC/mHC before their own block types
        name = "hc" if hyper.get("kind", "hc") == "hc" else "mhc"
    if name == "default" and attnres_size is not None:  # AttnRes on the default block, early
        name = "attnres"
    if name not in TRAINED:
        raise ConfigError(f"{WHAT}: config.json: model.block.name {name!r} is not a design the "
                          f"original trained; allowed: {', '.join(TRAINED)}")
    if name not in ("hc", "mhc"):
        block.refuse("hyper_connections", why=f"HC routing on a {name!r} block")
    if name != "attnres":
        block.refuse("attnres_block_size", why=f"AttnRes on a {name!r} block")
    if name not in ("depth_mup", "completep"):
        for alpha in ("attention_residual_alpha", "feed_forward_residual_alpha"):
            block.refuse(alpha, allowed=(None, 1, 1.0))
    norm_name = block.sub("layer_norm").opt("name") or "rms"
    want_norm = "default" if name == "deepnorm" else None
    if want_norm and norm_name != want_norm:
        raise ConfigError(f"{WHAT}: config.json: model.block.layer_norm.name {norm_name!r}: "
                          "deepnorm needs 'default' (mean-centred LayerNorm)")
    if not want_norm and norm_name not in ("rms", "fused_rms"):
        raise ConfigError(f"{WHAT}: config.json: model.block.layer_norm.name {norm_name!r} is "
                          "not supported for this block; allowed: rms")

    layout: dict[str, Any] = {"tied": bool(model.opt("tie_word_embeddings"))}
    departures: list[str] = []
    train: dict[str, Any] = {}
    residual: dict[str, Any] = {}
    if name in _PLAIN:
        family = _PLAIN[name]
        if family == "lns":
            residual["lns_power"] = 0.5
    elif name in ("depth_mup", "completep"):
        family = "completep"
        base = block.int("residual_scaling_base_depth")
        head_scale = _head_scale(saved)
        residual.update(completep_alpha=0.5 if name == "depth_mup" else 1.0,
                        completep_base_depth=base, completep_head_scale=head_scale)
        if head_scale == 1.0:
            # Depth-only runs train the blocks with the depth rule (pretrain_preln_mup.py
            # apply_depth_only_scaling): the family's rule, train.lr_rule = "family".
            train["lr_rule"] = "family"
        else:
            departures.append(f"depth-width muP (head output factor d_base/d = {head_scale:g}, "
                              "completep_head_scale): the logits are the original's, but its "
                              "width-muP init and per-group learning rates are not fields, so "
                              "training on from here is not the original's recipe")
    elif name in ("hc", "mhc"):
        family, residual, more = _hyper(block, name, form)
        hc_form_of = more.pop("form")
        layout.update(more)
        departures += more.pop("departures")
    elif name == "attnres":
        size = block.int("attnres_block_size", default=1)
        family = "attnres_full" if size == 1 else "attnres_block"
        if size > 1:
            residual["attnres_block_size"] = size
            residual["attnres_partition"] = "size"
        layout["attnres_size"] = size
        # The extra norms are built without an eps: OLMo-core's RMSNorm default.
        residual["attnres_eps"] = 1e-5
    else:  # moda, post_norm_moda
        family = "moda"
        moda = block.sub("moda") if isinstance(block.opt("moda"), dict) else _Fields({}, "")
        if moda.opt("extra_ffn_kv_proj") is False or moda.opt("extra_attn_kv_proj"):
            raise ConfigError(f"{WHAT}: config.json: model.block.moda: only the configuration "
                              "configure_moda trains is supported (extra_ffn_kv_proj true, "
                              "extra_attn_kv_proj false)")
        if not moda_last_override and block.opt("moda_skip_ffn_kv"):
            raise ConfigError(f"{WHAT}: config.json: model.block.moda_skip_ffn_kv on every "
                              "block is not supported")
        residual.update(moda_kv_heads=0, moda_norm="post" if name == "post_norm_moda" else "pre",
                        moda_depth_query="rotated")
        layout["moda_kv"] = True
    return OlmoModel(block=name, family=family, model_fields=fields, residual=residual,
                     layout=layout, departures=tuple(departures), form=hc_form_of,
                     train=train)


def _hyper(block: _Fields, name: str, asked: str) -> tuple[str, dict, dict]:
    """hc/mhc fields and layout from ``model.block.hyper_connections``."""
    raw = block.opt("hyper_connections")
    hc = _Fields(raw if isinstance(raw, dict) else {}, "model.block.hyper_connections")
    kind = hc.choice("kind", ("hc", "mhc", "liger_mhc"), "hc" if name == "hc" else "mhc")
    if (kind == "hc") != (name == "hc"):
        raise ConfigError(f"{WHAT}: config.json: {hc.where}.kind {kind!r} does not fit block "
                          f"type {name!r}")
    n = hc.int("num_residual_streams", default=4)
    tanh = hc.opt("tanh")
    tanh = (kind == "hc") if tanh is None else bool(tanh)
    collapse = hc.choice("collapse", ("auto", "sum", "mean"), "auto")
    mean = collapse == "mean" or (collapse == "auto" and kind == "liger_mhc")
    # Liger mHC computes one form in every version (its mean, then the norm).
    form = None if kind == "liger_mhc" else hc_form(block.data, kind, asked)
    early = form is not None and form.form == "early"
    readout = "mean_then_norm" if mean else ("norm_then_sum" if early else "sum_then_norm")
    residual: dict[str, Any] = {"hc_n": n, "hc_scale_init": hc.num("gating_factor_init", 0.01),
                                "readout": readout}
    layout = {"hc_kind": kind, "streams": n, "departures": [], "form": form}
    if kind == "hc":
        residual.update(hc_tanh=tanh, hc_write="residual" if early else "mixed")
        return "hc", residual, layout
    residual.update(sinkhorn_iters=hc.int("sinkhorn_iters", default=20), mhc_tanh=tanh)
    if kind == "liger_mhc":
        # LigerHyperConnection's own defaults, overridable by the config's liger_* keys.
        residual.update(
            sinkhorn_temperature=1.0, mhc_sinkhorn="linear", mhc_res_layout="out_in",
            mhc_sinkhorn_eps=hc.num("liger_sinkhorn_eps", 1e-6),
            mhc_rms_eps=hc.num("liger_rms_eps", 1e-6), mhc_gate_decay=False,
            mhc_phi_dtype=hc.choice("liger_phi_dtype", ("bfloat16", "float32"), "bfloat16"))
        for key, want in (("liger_pre_eps", 0.0), ("liger_post_mult", 2.0)):
            if hc.num(key, want) != want:
                raise ConfigError(f"{WHAT}: config.json: {hc.where}.{key} = {hc.num(key, want)} "
                                  f"is not supported (depthbench's mhc has {want:g})")
    else:  # PyTorch mHC: _forward_mhc's rms(f) eps 1e-8, log-domain sinkhorn_log
        residual.update(sinkhorn_temperature=hc.num("sinkhorn_tau", 1.0), mhc_sinkhorn="log",
                        mhc_res_layout="in_out", mhc_rms_eps=1e-8, mhc_gate_decay=True,
                        mhc_phi_dtype="param")
    return "mhc", residual, layout
