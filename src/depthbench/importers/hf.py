"""Import a local Hugging Face ``LlamaForCausalLM`` checkpoint as a pre_ln run.

A LLaMA decoder *is* depthbench's pre_ln backbone: ``x <- x + F(N(x))`` with
RMSNorm, RoPE (rotate-half), GQA attention with scale ``1/sqrt(head_dim)``
and a SwiGLU MLP ``down(silu(gate(x)) * up(x))``.  The import therefore only
renames and transposes weights (torch ``Linear`` stores ``[out, in]``)::

    embed_tokens.weight [V, d]        -> embed        [V, d]
    q_proj.weight [n*h, d]            -> attn/q       [d, n, h]  (k, v: kv heads)
    o_proj.weight [d, n*h]            -> attn/o       [n, h, d]
    gate/up_proj.weight [f, d]        -> mlp/gate, up [d, f]
    down_proj.weight [d, f]           -> mlp/down     [f, d]
    input/post_attention_layernorm    -> attn_norm / mlp_norm
    norm.weight                       -> final_norm/scale
    lm_head.weight [V, d]             -> head         [d, V]  (embed.T when tied)

and writes a run directory in the trainer's format
(:mod:`~depthbench.importers.run_writer`): ``config.json`` (the resolved
config, with ``resolved.hf`` saying where it came from) and an Orbax
checkpoint at step 0 holding a full ``TrainState`` (fresh optimizer state),
plus the tokenizer files copied along (``tokenizer.json`` ...).

Supported: any config without a ``rope_scaling`` (or ``rope_parameters`` of
type "default"): GQA, tied or untied embeddings, any ``rope_theta`` and
``rms_norm_eps``.  Tied embeddings import as an untied copy (identical
logits; a fine-tune would untie them).  Anything the backbone does not
compute (rope scaling, attention/MLP biases, another activation, a
``head_dim`` other than ``hidden_size / num_attention_heads``) is refused
with one line.  Only local paths; safetensors are read without torch
(bfloat16, which numpy lacks, through ``ml_dtypes`` from the file's header);
a file that is not one (truncated, garbage) is one line naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from depthbench.errors import ConfigError
from depthbench.importers import run_writer

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16}


# ----------------------------------------------------------------- config


def read_hf_config(src: Path) -> dict:
    return run_writer.read_source_config(
        src, "import-hf", "a local Hugging Face checkpoint directory with config.json and "
        "*.safetensors")


def _rope_theta(hf: dict, where: Path) -> float:
    """rope_theta from a transformers 4 (``rope_theta``/``rope_scaling``) or 5
    (``rope_parameters``) config; any scaling is refused."""
    scaling = hf.get("rope_scaling") or {}
    params = hf.get("rope_parameters") or {}
    kinds = [scaling.get("rope_type", scaling.get("type"))] if scaling else []
    kinds += [params.get("rope_type", "default")] if params else []
    for kind in kinds:
        if kind != "default":
            raise ConfigError(f"import-hf: {where}: rope_scaling of type {kind!r} is not "
                              "supported (only unscaled RoPE: rope_scaling null or rope_type "
                              "'default')")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def model_fields(hf: dict, where: Path) -> dict[str, Any]:
    """The depthbench model fields of a Llama config (ConfigError if unsupported)."""
    arch = hf.get("architectures") or []
    if hf.get("model_type") != "llama" and "LlamaForCausalLM" not in arch:
        raise ConfigError(f"import-hf: {where}: model_type {hf.get('model_type')!r} is not "
                          "supported; allowed: llama (LlamaForCausalLM)")
    required = ("hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "vocab_size")
    missing = [k for k in required if not isinstance(hf.get(k), int)]
    if missing:
        raise ConfigError(f"import-hf: {where}: missing integer field {missing[0]!r}")
    d, n = hf["hidden_size"], hf["num_attention_heads"]
    kv = hf.get("num_key_value_heads") or n
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"import-hf: {where}: hidden_act {act!r} is not supported; allowed: silu")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag):
            raise ConfigError(f"import-hf: {where}: {flag}=true is not supported (the backbone "
                              "has no biases)")
    if d % n or (hf.get("head_dim") not in (None, d // n)):
        raise ConfigError(f"import-hf: {where}: head_dim {hf.get('head_dim')} must equal "
                          f"hidden_size / num_attention_heads = {d}/{n}")
    if n % kv:
        raise ConfigError(f"import-hf: {where}: num_key_value_heads {kv} must divide "
                          f"num_attention_heads {n}")
    return {"depth": hf["num_hidden_layers"], "d_model": d, "d_ff": hf["intermediate_size"],
            "n_heads": n, "n_kv_heads": kv, "vocab_size": hf["vocab_size"],
            "norm_eps": float(hf.get("rms_norm_eps", 1e-6)), "rope_theta": _rope_theta(hf, where)}


# ------------------------------------------------------------- safetensors


def _safetensor_files(src: Path) -> list[Path]:
    index = src / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [src / name for name in names]
    else:
        files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"import-hf: {src} holds no *.safetensors (pytorch_model.bin is not "
                          "read: it needs torch; re-save with safe_serialization=True)")
    for f in files:
        if not f.is_file():
            raise ConfigError(f"import-hf: {f} (listed in model.safetensors.index.json) is missing")
    return files


def _read_bf16(path: Path, name: str) -> np.ndarray:
    """A BF16 tensor (numpy has no bfloat16) via the documented file layout:
    8-byte little-endian header size, JSON header, then the raw buffer."""
    import ml_dtypes

    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    info = header[name]
    start, end = info["data_offsets"]
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size + start, shape=(end - start,))
    return np.asarray(raw).view(ml_dtypes.bfloat16).reshape(info["shape"])


def _safetensors():
    """``safetensors.safe_open`` and its error type; one line naming the extra without it."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise ConfigError("import-hf needs the 'safetensors' package: "
                          "pip install 'depthbench[eval]'") from None
    return safe_open, SafetensorError


def read_tensors(src: Path, *, progress: bool = False) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint as fp32 numpy (no torch).  A file that is
    not a readable safetensors file (truncated, garbage) is a ConfigError."""
    from tqdm import tqdm

    safe_open, safetensor_error = _safetensors()
    out = {}
    files = _safetensor_files(src)
    for path in tqdm(files, desc="reading safetensors", unit="file",
                     disable=not progress or len(files) < 2):
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():
                    dtype = f.get_slice(name).get_dtype()
                    if dtype in _DTYPES:
                        out[name] = f.get_tensor(name).astype(np.float32)
                    elif dtype == "BF16":
                        out[name] = _read_bf16(path, name).astype(np.float32)
                    else:
                        raise ConfigError(f"import-hf: {path}: tensor {name} has dtype {dtype}; "
                                          "allowed: F32, F16, BF16, F64")
        except (safetensor_error, OSError, ValueError, KeyError) as e:
            why = " ".join(str(e).split())[:160] or type(e).__name__
            raise ConfigError(f"import-hf: {path} is not a readable safetensors file "
                              f"({why})") from None
    return out


def convert(tensors: dict[str, np.ndarray], fields: dict[str, Any], tied: bool, where: Path
            ) -> dict:
    """HF Llama tensors -> depthbench pre_ln params (numpy fp32, stacked blocks)."""
    L, d, n, kv = fields["depth"], fields["d_model"], fields["n_heads"], fields["n_kv_heads"]
    h = d // n

    def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = name if name in tensors else f"model.{name}"
        if key not in tensors:
            raise ConfigError(f"import-hf: {where}: tensor {name!r} is missing")
        x = tensors[key]
        if tuple(x.shape) != shape:
            raise ConfigError(f"import-hf: {where}: tensor {key!r} has shape {tuple(x.shape)}, "
                              f"config.json implies {shape}")
        return x

    f, V = fields["d_ff"], fields["vocab_size"]
    blocks: dict[str, list] = {k: [] for k in ("q", "k", "v", "o", "gate", "up", "down",
                                                "attn_norm", "mlp_norm")}
    for i in range(L):
        p = f"layers.{i}."
        blocks["q"].append(take(p + "self_attn.q_proj.weight", (n * h, d)).T.reshape(d, n, h))
        blocks["k"].append(take(p + "self_attn.k_proj.weight", (kv * h, d)).T.reshape(d, kv, h))
        blocks["v"].append(take(p + "self_attn.v_proj.weight", (kv * h, d)).T.reshape(d, kv, h))
        blocks["o"].append(take(p + "self_attn.o_proj.weight", (d, n * h)).T.reshape(n, h, d))
        blocks["gate"].append(take(p + "mlp.gate_proj.weight", (f, d)).T)
        blocks["up"].append(take(p + "mlp.up_proj.weight", (f, d)).T)
        blocks["down"].append(take(p + "mlp.down_proj.weight", (d, f)).T)
        blocks["attn_norm"].append(take(p + "input_layernorm.weight", (d,)))
        blocks["mlp_norm"].append(take(p + "post_attention_layernorm.weight", (d,)))
    stack = {k: np.ascontiguousarray(np.stack(v)) for k, v in blocks.items()}
    embed = take("embed_tokens.weight", (V, d))
    if "lm_head.weight" in tensors:
        head = take("lm_head.weight", (V, d)).T
    elif tied:
        head = embed.T
    else:
        raise ConfigError(f"import-hf: {where}: lm_head.weight is missing and "
                          "tie_word_embeddings is false")
    return {
        "blocks": {"attn": {k: stack[k] for k in "qkvo"},
                   "attn_norm": stack["attn_norm"],
                   "mlp": {k: stack[k] for k in ("gate", "up", "down")},
                   "mlp_norm": stack["mlp_norm"]},
        "embed": embed,
        "final_norm": {"scale": take("norm.weight", (d,))},
        "head": np.ascontiguousarray(head),
    }


# -------------------------------------------------------------- the import


def import_hf(src: str | Path, out: str | Path, *, progress: bool = True) -> dict:
    """Convert the checkpoint at ``src`` into the run directory ``out``; return
    the config dict written to ``out/config.json``."""
    if "://" in str(src) or not Path(src).expanduser().is_dir():
        raise ConfigError(f"import-hf: {str(src)!r} is not a local directory (the hub is never "
                          "contacted; download the checkpoint first)")
    src = Path(src).expanduser().resolve()
    out = run_writer.check_out(out, "import-hf")
    _safetensors()  # before any work: the one line naming the extra
    hf = read_hf_config(src)
    fields = model_fields(hf, src / "config.json")
    from depthbench.model.residual.protocol import registry

    # A LLaMA decoder is the baseline family, the plain backbone.
    config = run_writer.run_config("import-hf", registry.baseline(), fields, {},
                                   int(hf.get("max_position_embeddings") or 2048))
    tied = bool(hf.get("tie_word_embeddings", False))
    params_np = convert(read_tensors(src, progress=progress), fields, tied, src)

    def first(x):
        return x[0] if isinstance(x, list) and x else x

    eos, bos, pad = (first(hf.get(k)) for k in ("eos_token_id", "bos_token_id", "pad_token_id"))
    record = {"source": str(src), "architectures": hf.get("architectures"),
              "tie_word_embeddings": tied, "torch_dtype": hf.get("torch_dtype", hf.get("dtype")),
              "max_position_embeddings": hf.get("max_position_embeddings")}
    files = {name: src / name for name in run_writer.TOKENIZER_FILES if (src / name).is_file()}
    return run_writer.write_run(out, config, params_np, source=("hf", record), files=files,
                                tokenizer={"eos": eos, "bos": bos, "pad": pad},
                                optimizer_state=True)
