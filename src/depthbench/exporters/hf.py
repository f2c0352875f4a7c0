"""Export a run of the baseline family as a Hugging Face ``LlamaForCausalLM`` checkpoint.

The inverse of :mod:`depthbench.importers.hf`: the baseline family is the
plain LLaMA decoder (RMSNorm, rotate-half RoPE, GQA attention, SwiGLU), so the
export only renames and transposes (depthbench's ``[in, out]`` leaves to
torch ``Linear``'s ``[out, in]``)::

    embed [V, d]           -> model.embed_tokens.weight
    attn/q, k, v [d, n, h] -> model.layers.{i}.self_attn.{q,k,v}_proj.weight [n*h, d]
    attn/o [n, h, d]       -> model.layers.{i}.self_attn.o_proj.weight [d, n*h]
    mlp/gate, up [d, f]    -> model.layers.{i}.mlp.{gate,up}_proj.weight [f, d]
    mlp/down [f, d]        -> model.layers.{i}.mlp.down_proj.weight [d, f]
    attn_norm, mlp_norm    -> input_layernorm, post_attention_layernorm
    final_norm/scale       -> model.norm.weight
    head [d, V]            -> lm_head.weight [V, d]

``OUT`` gets ``model.safetensors`` (fp32, written without torch),
``config.json`` (a ``LlamaConfig``: the run's shape, ``rms_norm_eps``,
``rope_theta``, its training length as ``max_position_embeddings``, its
tokenizer's special ids) and the run's tokenizer files (with a
``tokenizer_config.json`` naming the special tokens where the run has none).
Any other family is refused in one line: it computes something a Llama does
not (export-olmo writes those in the original's format).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from depthbench.errors import ConfigError
from depthbench.exporters.source_run import SourceRun, open_run
from depthbench.importers import run_writer

WHAT = "export-hf"
WEIGHTS = "model.safetensors"


def _save_file():
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise ConfigError(f"{WHAT} needs the 'safetensors' package: "
                          "pip install 'depthbench[eval]'") from None
    return save_file


def hf_tensors(params: dict, config) -> dict[str, np.ndarray]:
    """depthbench's parameter tree (host arrays) as a Llama state dict (fp32)."""
    m = config.model
    L, d, n, kv, h = (int(m.depth), int(m.d_model), int(m.n_heads), int(m.n_kv_heads),
                      int(m.d_model) // int(m.n_heads))
    b = params["blocks"]

    def f32(x) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(x, np.float32))

    out = {"model.embed_tokens.weight": f32(params["embed"]),
           "model.norm.weight": f32(params["final_norm"]["scale"]),
           "lm_head.weight": f32(np.asarray(params["head"]).T)}
    for i in range(L):
        p = f"model.layers.{i}."
        for name, heads in (("q", n), ("k", kv), ("v", kv)):
            out[p + f"self_attn.{name}_proj.weight"] = f32(
                np.asarray(b["attn"][name][i]).reshape(d, heads * h).T)
        out[p + "self_attn.o_proj.weight"] = f32(np.asarray(b["attn"]["o"][i]).reshape(n * h, d).T)
        for name in ("gate", "up", "down"):
            out[p + f"mlp.{name}_proj.weight"] = f32(np.asarray(b["mlp"][name][i]).T)
        out[p + "input_layernorm.weight"] = f32(b["attn_norm"][i])
        out[p + "post_attention_layernorm.weight"] = f32(b["mlp_norm"][i])
    return out


def _token_id(tokenizer: dict, key: str) -> int | None:
    value = int(tokenizer.get(key, -1))
    return None if value < 0 else value


def llama_config(config, resolved: dict) -> dict:
    """config.json of the export (transformers 4 and 5 read it: rope_theta and
    rope_parameters both)."""
    m = config.model
    tok = resolved.get("tokenizer") or {}
    theta = float(m.rope_theta)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": int(m.d_model), "intermediate_size": int(m.d_ff),
            "num_hidden_layers": int(m.depth), "num_attention_heads": int(m.n_heads),
            "num_key_value_heads": int(m.n_kv_heads),
            "head_dim": int(m.d_model) // int(m.n_heads), "vocab_size": int(m.vocab_size),
            "hidden_act": "silu", "rms_norm_eps": float(m.norm_eps), "rope_theta": theta,
            "rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": theta},
            "max_position_embeddings": int(config.train.seq_len),
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "tie_word_embeddings": False, "initializer_range": float(m.init_std),
            "torch_dtype": "float32", "use_cache": True,
            "bos_token_id": _token_id(tok, "bos_id"), "eos_token_id": _token_id(tok, "eos_id"),
            "pad_token_id": _token_id(tok, "pad_id")}


def _tokenizer_config(source: SourceRun, files: dict[str, Path]) -> dict | None:
    """A tokenizer_config.json for a run without one: its special tokens by their text
    (through the one tokenizer interface), none added when encoding, as depthbench
    encodes."""
    if "tokenizer_config.json" in files or not files:
        return None
    tok = source.loaded.tokenizer
    named = {f"{kind}_token": tok.token_text(i) for kind, i in
             (("bos", tok.bos_id), ("eos", tok.eos_id), ("pad", tok.pad_id)) if i >= 0}
    cls = "PreTrainedTokenizerFast" if "tokenizer.json" in files else "LlamaTokenizer"
    return {"tokenizer_class": cls, "add_bos_token": False, "add_eos_token": False, **named}


def export_hf(run_dir: str | Path, out: str | Path, *, progress: bool = True) -> dict:
    """Write ``run_dir``'s newest intact checkpoint to the folder ``out``; return what
    was written (``step``, ``tensors``, ``copied``)."""
    from depthbench.model.residual.protocol import registry

    out = run_writer.check_out(out, WHAT)
    source = open_run(run_dir, WHAT)
    family, baseline = source.config.model.family, registry.baseline()
    if family != baseline:
        raise ConfigError(f"{WHAT}: a {family} run is not a Llama (only {baseline} runs, the "
                          "plain LLaMA decoder, are); export-olmo writes the original "
                          "DepthBench's format")
    save_file = _save_file()
    tensors = hf_tensors(source.params(), source.config)
    files = source.tokenizer_files()
    tok_config = _tokenizer_config(source, files)
    if progress:
        print(f"{WHAT}: writing {len(tensors)} tensors to {out}", flush=True)
    with run_writer.built_aside(out, WHAT, "exporting") as work:
        save_file(tensors, str(work / WEIGHTS), metadata={"format": "pt"})
        (work / "config.json").write_text(json.dumps(llama_config(source.config,
                                                                  source.resolved), indent=1))
        for name, src in files.items():
            (work / name).write_bytes(src.read_bytes())
        if tok_config is not None:
            (work / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1))
    return {"step": source.loaded.step, "tensors": len(tensors),
            "copied": sorted(files) + (["tokenizer_config.json"] if tok_config else [])}
