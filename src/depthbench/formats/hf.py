"""A Hugging Face ``LlamaForCausalLM`` checkpoint, both ways (import-hf, export-hf).

A LLaMA decoder *is* depthbench's baseline backbone: ``x <- x + F(N(x))`` with
RMSNorm, RoPE (rotate-half), GQA attention with scale ``1/sqrt(head_dim)``
and a SwiGLU MLP ``down(silu(gate(x)) * up(x))``.  Both directions only
rename and transpose, through one table (:func:`tensor_map`; torch ``Linear``
stores ``[out, in]``, depthbench ``[in, out]``, attention heads split out)::

    model.embed_tokens.weight [V, d]          <-> embed         [V, d]
    layers.i.self_attn.q_proj.weight [n*h, d] <-> attn/q [i]    [d, n, h]  (k, v: kv heads)
    layers.i.self_attn.o_proj.weight [d, n*h] <-> attn/o [i]    [n, h, d]
    layers.i.mlp.gate/up_proj.weight [f, d]   <-> mlp/gate, up  [d, f]
    layers.i.mlp.down_proj.weight [d, f]      <-> mlp/down      [f, d]
    input/post_attention_layernorm            <-> attn_norm / mlp_norm
    model.norm.weight                         <-> final_norm/scale
    lm_head.weight [V, d]                     <-> head          [d, V]  (embed.T when tied)

and the config both ways (:func:`model_fields`, :func:`llama_config`).

``import-hf`` writes a run directory in the trainer's format
(:mod:`~depthbench.formats.run_writer`): ``config.json`` (with
``resolved.hf`` saying where it came from) and an Orbax checkpoint at step 0
holding a full ``TrainState`` (fresh optimizer state), plus the tokenizer
files.  Supported: any config without a ``rope_scaling`` (or
``rope_parameters`` of type "default"): GQA, tied or untied embeddings, any
``rope_theta`` and ``rms_norm_eps``; tied embeddings import as an untied copy
(identical logits).  Anything the backbone does not compute (rope scaling,
biases, another activation, a ``head_dim`` other than ``hidden_size /
num_attention_heads``) is one line.  Only local paths, and only regular files
inside the checkpoint directory (:mod:`depthbench.confine`: the index's
``weight_map`` and the tokenizer files too); config.json is read within the
JSON bounds and field by field (:class:`_Fields`), and its shape is checked
against the tensors the safetensors headers declare before anything is built
or read (:func:`check_declared`); safetensors are read without torch
(bfloat16 through ``ml_dtypes``).

``export-hf`` writes a baseline run's newest intact checkpoint as
``model.safetensors`` (fp32, written without torch), ``config.json`` (a
``LlamaConfig``: the run's shape, ``rms_norm_eps``, ``rope_theta``, its
training length as ``max_position_embeddings``, its tokenizer's special ids)
and the run's tokenizer files (with a ``tokenizer_config.json`` naming the
special tokens where the run has none).  Any other family computes what a
Llama does not: export-olmo writes those in the original's format.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from depthbench import confine, output_paths
from depthbench.errors import ConfigError
from depthbench.formats import run_writer
from depthbench.rundir.names import TOKENIZER_FILES

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
HEADER_LIMIT = 100 << 20  # bytes of a safetensors header (the safetensors library's own cap)

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16}


# ----------------------------------------------------------------- config


def read_hf_config(src: Path) -> dict:
    return run_writer.read_source_config(
        src, "import-hf", "a local Hugging Face checkpoint directory with config.json and "
        "*.safetensors")


class _Fields:
    """Typed reads of a Hugging Face config.json, each failure one line naming
    the field and what it may be."""

    def __init__(self, data: dict, where: Path, prefix: str = ""):
        self.data, self.where, self.prefix = data, where, prefix

    def fail(self, name: str, allowed: str) -> ConfigError:
        return ConfigError(f"import-hf: {self.where}: {self.prefix}{name} must be {allowed}, "
                           f"got {str(self.data.get(name))[:40]}")

    def get(self, name: str, kinds: type | tuple[type, ...], allowed: str, default: Any = None,
            ok=lambda value: True) -> Any:
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, bool) != (kinds is bool) or not isinstance(value, kinds) or not ok(
                value):
            raise self.fail(name, allowed)
        return value

    def count(self, name: str, default: int | None = None) -> int:
        value = self.get(name, int, "an integer >= 1", default, lambda v: v >= 1)
        if value is None:
            raise ConfigError(f"import-hf: {self.where}: missing integer field {name!r}")
        return value

    def positive(self, name: str, default: float) -> float:
        return float(self.get(name, (int, float), "a positive number", default,
                              lambda v: math.isfinite(v) and v > 0))

    def section(self, name: str) -> _Fields:
        return _Fields(self.get(name, dict, "an object (or null)", {}), self.where,
                       f"{self.prefix}{name}.")


def _rope_theta(hf: _Fields) -> float:
    """rope_theta from a transformers 4 (``rope_theta``/``rope_scaling``) or 5
    (``rope_parameters``) config; any scaling is refused."""
    scaling, params = hf.section("rope_scaling"), hf.section("rope_parameters")
    kinds = [scaling.get("rope_type", str, "text", scaling.get("type", str, "text"))
             ] if scaling.data else []
    kinds += [params.get("rope_type", str, "text", "default")] if params.data else []
    for kind in kinds:
        if kind != "default":
            raise ConfigError(f"import-hf: {hf.where}: rope_scaling of type {kind!r} is not "
                              "supported (only unscaled RoPE: rope_scaling null or rope_type "
                              "'default')")
    return params.positive("rope_theta", hf.positive("rope_theta", 10000.0))


def model_fields(hf: dict, where: Path) -> dict[str, Any]:
    """The depthbench model fields of a Llama config (ConfigError if unsupported),
    every field it reads checked for its type and range."""
    f = _Fields(hf, where)
    arch = f.get("architectures", list, "a list of class names", [],
                 lambda v: all(isinstance(a, str) for a in v))
    model_type = f.get("model_type", str, "text")
    if model_type != "llama" and "LlamaForCausalLM" not in arch:
        raise ConfigError(f"import-hf: {where}: model_type {model_type!r} is not "
                          "supported; allowed: llama (LlamaForCausalLM)")
    d, n = f.count("hidden_size"), f.count("num_attention_heads")
    depth, d_ff, vocab = (f.count(k) for k in ("num_hidden_layers", "intermediate_size",
                                               "vocab_size"))
    kv = f.count("num_key_value_heads", n)
    act = f.get("hidden_act", str, "text", "silu")
    if act != "silu":
        raise ConfigError(f"import-hf: {where}: hidden_act {act!r} is not supported; allowed: silu")
    for flag in ("attention_bias", "mlp_bias"):
        if f.get(flag, bool, "true or false", False):
            raise ConfigError(f"import-hf: {where}: {flag}=true is not supported (the backbone "
                              "has no biases)")
    head_dim = f.get("head_dim", int, "an integer", d // n)
    if d % n or head_dim != d // n:
        raise ConfigError(f"import-hf: {where}: head_dim {head_dim} must equal "
                          f"hidden_size / num_attention_heads = {d}/{n}")
    if n % kv:
        raise ConfigError(f"import-hf: {where}: num_key_value_heads {kv} must divide "
                          f"num_attention_heads {n}")
    return {"depth": depth, "d_model": d, "d_ff": d_ff, "n_heads": n, "n_kv_heads": kv,
            "vocab_size": vocab, "norm_eps": f.positive("rms_norm_eps", 1e-6),
            "rope_theta": _rope_theta(f)}


def import_record(hf: dict, where: Path, vocab_size: int) -> dict[str, Any]:
    """What import-hf takes from config.json beside the model: the training length
    (``max_len``), ``tied``, the special tokens' ids (``tokenizer``: the first
    of a list) and what it records; each field checked."""
    f = _Fields(hf, where)
    max_len = run_writer.length(hf.get("max_position_embeddings"),
                                f"import-hf: {where}: max_position_embeddings", 2048)
    tied = f.get("tie_word_embeddings", bool, "true or false", False)
    ids = {}
    for kind in ("eos", "bos", "pad"):
        value = hf.get(f"{kind}_token_id")
        value = value[0] if isinstance(value, list) and value else value
        ids[kind] = run_writer.token_id(value, f"import-hf: {where}: {kind}_token_id",
                                        vocab_size)
    dtype = f.get("torch_dtype", str, "text", f.get("dtype", str, "text"))
    return {"max_len": max_len, "tied": tied, "tokenizer": ids,
            "record": {"architectures": f.get("architectures", list, "a list"),
                       "tie_word_embeddings": tied, "torch_dtype": dtype,
                       "max_position_embeddings": hf.get("max_position_embeddings")}}


# ------------------------------------------------------------ tensor map


class Entry(NamedTuple):
    """One checkpoint tensor: its name, the parameter leaf it is (``index``: the
    block, for stacked block parameters) and both shapes.  A ``Linear`` weight
    converts as ``ours = theirs.T.reshape(our_shape)``; the embedding and the
    norms are the same either way."""

    hf: str
    leaf: str
    index: int | None
    hf_shape: tuple[int, ...]
    our_shape: tuple[int, ...]
    linear: bool = True

    def to_ours(self, x: np.ndarray) -> np.ndarray:
        return x.T.reshape(self.our_shape) if self.linear else x

    def to_hf(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.hf_shape[::-1]).T if self.linear else x


def tensor_map(depth: int, d: int, d_ff: int, n: int, kv: int, vocab: int) -> list[Entry]:
    """Every tensor of a Llama of this shape, in checkpoint order (the head last)."""
    h = d // n
    out = [Entry("model.embed_tokens.weight", "embed", None, (vocab, d), (vocab, d), False)]
    for i in range(depth):
        p = f"model.layers.{i}."
        for name, heads in (("q", n), ("k", kv), ("v", kv)):
            out.append(Entry(f"{p}self_attn.{name}_proj.weight", f"blocks/attn/{name}", i,
                             (heads * h, d), (d, heads, h)))
        out += [Entry(f"{p}self_attn.o_proj.weight", "blocks/attn/o", i, (d, n * h), (n, h, d)),
                Entry(f"{p}mlp.gate_proj.weight", "blocks/mlp/gate", i, (d_ff, d), (d, d_ff)),
                Entry(f"{p}mlp.up_proj.weight", "blocks/mlp/up", i, (d_ff, d), (d, d_ff)),
                Entry(f"{p}mlp.down_proj.weight", "blocks/mlp/down", i, (d, d_ff), (d_ff, d)),
                Entry(f"{p}input_layernorm.weight", "blocks/attn_norm", i, (d,), (d,), False),
                Entry(f"{p}post_attention_layernorm.weight", "blocks/mlp_norm", i, (d,), (d,),
                      False)]
    out += [Entry("model.norm.weight", "final_norm/scale", None, (d,), (d,), False),
            Entry("lm_head.weight", "head", None, (vocab, d), (d, vocab))]
    return out


def _leaf(tree: dict, path: str, create: bool = False):
    *parents, name = path.split("/")
    for key in parents:
        tree = tree.setdefault(key, {}) if create else tree[key]
    return tree, name


# ------------------------------------------------------------- safetensors


def _safetensor_files(src: Path) -> list[Path]:
    """The checkpoint's safetensors files: those its index names, else every
    ``*.safetensors``; each a regular file inside ``src``."""
    index = confine.regular_file(src, INDEX, f"import-hf: {INDEX}")
    if index is not None:
        names = sorted(set(_weight_map(index).values()))
        files = [confine.member(src, name, f"import-hf: {index}: weight_map") for name in names]
    else:
        files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"import-hf: {src} holds no *.safetensors (pytorch_model.bin is not "
                          "read: it needs torch; re-save with safe_serialization=True)")
    for f in files:
        if not f.exists() and not f.is_symlink():
            raise ConfigError(f"import-hf: {f} (listed in {INDEX}) is missing")
        if not confine.is_regular(f):
            why = "a symbolic link; links are not followed out of a checkpoint (copy the " \
                "file in)" if f.is_symlink() else "not a regular file"
            raise ConfigError(f"import-hf: {f} is {why}")
    return files


def _weight_map(index: Path) -> dict[str, str]:
    """``weight_map`` of the safetensors index: tensor name -> file name."""
    from depthbench.rundir.io import read_json

    try:
        data = read_json(index)
    except ConfigError as e:
        raise ConfigError(f"import-hf: {e}") from None
    weights = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weights, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weights.items()):
        raise ConfigError(f"import-hf: {index}: weight_map must be a JSON object of tensor "
                          "name -> file name (strings)")
    return weights


def _read_bf16(path: Path, name: str) -> np.ndarray:
    """A BF16 tensor (numpy has no bfloat16) via the documented file layout:
    8-byte little-endian header size, JSON header, then the raw buffer (the
    header and the offsets already checked by ``safe_open``)."""
    import ml_dtypes

    from depthbench.rundir.io import loads

    with confine.open_regular(path, "import-hf") as f:
        size = int.from_bytes(f.read(8), "little")
        if size > HEADER_LIMIT:
            raise ValueError(f"a header of {size:,} bytes")
        header = loads(f.read(size), path)
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


def _each_tensor(files: list[Path], read: bool, progress: bool = False):
    """``(name, shape, array or None)`` of every tensor in ``files`` (``read``: the
    array as fp32 numpy, no torch; else only what the header declares, which
    ``safe_open`` has checked against the file's size).  A file that is not a
    readable safetensors file (truncated, garbage) is a ConfigError."""
    from tqdm import tqdm

    safe_open, safetensor_error = _safetensors()
    for path in tqdm(files, desc="reading safetensors", unit="file",
                     disable=not progress or len(files) < 2):
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():
                    dtype = f.get_slice(name).get_dtype()
                    if dtype not in (*_DTYPES, "BF16"):
                        raise TypeError(f"tensor {name} has dtype {dtype}; allowed: F32, F16, "
                                        "BF16, F64")
                    if not read:
                        yield name, tuple(f.get_slice(name).get_shape()), None
                    elif dtype == "BF16":
                        yield name, None, _read_bf16(path, name).astype(np.float32)
                    else:
                        yield name, None, f.get_tensor(name).astype(np.float32)
        except TypeError as e:
            raise ConfigError(f"import-hf: {path}: {e}") from None
        except (safetensor_error, OSError, ValueError, KeyError) as e:
            why = " ".join(str(e).split())[:160] or type(e).__name__
            raise ConfigError(f"import-hf: {path} is not a readable safetensors file "
                              f"({why})") from None


def read_tensors(src: Path, *, progress: bool = False) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint as fp32 numpy (no torch)."""
    return {name: x for name, _, x in _each_tensor(_safetensor_files(src), True, progress)}


def check_declared(fields: dict[str, Any], tied: bool, src: Path, where: Path) -> None:
    """config.json's shape against the tensors the checkpoint's headers declare,
    before anything is built or read (:func:`run_writer.check_declared`)."""
    present = {name.removeprefix("model."): shape
               for name, shape, _ in _each_tensor(_safetensor_files(src), False)}
    run_writer.check_declared(
        fields, present, tied=tied, block=r"layers\.(\d{1,9})\.", embed="embed_tokens.weight",
        where=f"import-hf: {where}", names={
            "depth": "num_hidden_layers", "d_model": "hidden_size", "vocab_size": "vocab_size",
            "d_ff": "intermediate_size"})


def convert(tensors: dict[str, np.ndarray], fields: dict[str, Any], tied: bool, where: Path
            ) -> dict:
    """HF Llama tensors -> depthbench baseline params (numpy fp32, stacked blocks)."""
    entries = tensor_map(fields["depth"], fields["d_model"], fields["d_ff"], fields["n_heads"],
                         fields["n_kv_heads"], fields["vocab_size"])

    def take(e: Entry) -> np.ndarray:
        key = e.hf if e.hf in tensors else e.hf.removeprefix("model.")
        if key not in tensors:
            if e.leaf == "head" and tied:  # the head is the embedding
                return take(entries[0]).T
            if e.leaf == "head":
                raise ConfigError(f"import-hf: {where}: lm_head.weight is missing and "
                                  "tie_word_embeddings is false")
            raise ConfigError(f"import-hf: {where}: tensor {e.hf.removeprefix('model.')!r} is "
                              "missing")
        x = tensors[key]
        if tuple(x.shape) != e.hf_shape:
            raise ConfigError(f"import-hf: {where}: tensor {key!r} has shape {tuple(x.shape)}, "
                              f"config.json implies {e.hf_shape}")
        return e.to_ours(x)

    params: dict = {}
    stacked: dict[str, list] = {}
    for e in entries:
        x = take(e)
        if e.index is None:
            parent, name = _leaf(params, e.leaf, create=True)
            parent[name] = np.ascontiguousarray(x)
        else:
            stacked.setdefault(e.leaf, []).append(x)
    for leaf, xs in stacked.items():
        parent, name = _leaf(params, leaf, create=True)
        parent[name] = np.ascontiguousarray(np.stack(xs))
    return params


def hf_tensors(params: dict, spec) -> dict[str, np.ndarray]:
    """depthbench's parameter tree (host arrays) of a baseline model of ``spec``
    as a Llama state dict (fp32)."""
    out = {}
    for e in tensor_map(spec.depth, spec.d_model, spec.d_ff, spec.n_heads, spec.n_kv_heads,
                        spec.vocab_size):
        parent, name = _leaf(params, e.leaf)
        x = np.asarray(parent[name])
        x = x[e.index] if e.index is not None else x
        out[e.hf] = np.ascontiguousarray(e.to_hf(x), dtype=np.float32)
    return out


def _token_id(tokenizer: dict, key: str) -> int | None:
    value = int(tokenizer.get(key, -1))
    return None if value < 0 else value


def llama_config(spec, seq_len: int, resolved: dict) -> dict:
    """config.json of an export of a baseline model of ``spec`` (transformers 4
    and 5 read it: rope_theta and rope_parameters both); ``seq_len``: its
    training length; ``resolved``: the run's config.json "resolved" block."""
    tok = resolved.get("tokenizer") or {}
    theta = float(spec.rope_theta)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": spec.d_model, "intermediate_size": spec.d_ff,
            "num_hidden_layers": spec.depth, "num_attention_heads": spec.n_heads,
            "num_key_value_heads": spec.n_kv_heads, "head_dim": spec.head_dim,
            "vocab_size": spec.vocab_size, "hidden_act": "silu",
            "rms_norm_eps": float(spec.norm_eps), "rope_theta": theta,
            "rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": theta},
            "max_position_embeddings": int(seq_len),
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "tie_word_embeddings": False, "initializer_range": float(spec.init_std),
            "torch_dtype": "float32", "use_cache": True,
            "bos_token_id": _token_id(tok, "bos_id"), "eos_token_id": _token_id(tok, "eos_id"),
            "pad_token_id": _token_id(tok, "pad_id")}


# -------------------------------------------------------------- the import


def import_hf(src: str | Path, out: str | Path, *, progress: bool = True) -> dict:
    """Convert the checkpoint at ``src`` into the run directory ``out``; return
    the config dict written to ``out/config.json``."""
    if "://" in str(src) or not Path(src).expanduser().is_dir():
        raise ConfigError(f"import-hf: {str(src)!r} is not a local directory (the hub is never "
                          "contacted; download the checkpoint first)")
    src = Path(src).expanduser().resolve()
    out = output_paths.check_out(out, "import-hf")
    _safetensors()  # before any work: the one line naming the extra
    hf = read_hf_config(src)
    where = src / "config.json"
    fields = model_fields(hf, where)
    extra = import_record(hf, where, fields["vocab_size"])
    files = {name: path for name in TOKENIZER_FILES
             if (path := confine.regular_file(src, name, f"import-hf: {name}")) is not None}
    check_declared(fields, extra["tied"], src, where)
    from depthbench.model.residual.protocol import registry

    # A LLaMA decoder is the baseline family, the plain backbone.
    config = run_writer.run_config("import-hf", registry.baseline(), fields, {},
                                   extra["max_len"])
    params_np = convert(read_tensors(src, progress=progress), fields, extra["tied"], src)
    return run_writer.write_run(out, config, params_np,
                                source=("hf", {"source": str(src), **extra["record"]}),
                                files=files, tokenizer=extra["tokenizer"], optimizer_state=True)


def _save_file():
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise ConfigError("export-hf needs the 'safetensors' package: "
                          "pip install 'depthbench[eval]'") from None
    return save_file


def _tokenizer_config(run, files: dict[str, Path]) -> dict | None:
    """A tokenizer_config.json for a run without one: its special tokens by their
    text (through the one tokenizer interface), none added when encoding, as
    depthbench encodes."""
    if "tokenizer_config.json" in files or not files:
        return None
    tok = run.tokenizer
    named = {f"{kind}_token": tok.token_text(i) for kind, i in
             (("bos", tok.bos_id), ("eos", tok.eos_id), ("pad", tok.pad_id)) if i >= 0}
    cls = "PreTrainedTokenizerFast" if "tokenizer.json" in files else "LlamaTokenizer"
    return {"tokenizer_class": cls, "add_bos_token": False, "add_eos_token": False, **named}


def export_hf(run_dir: str | Path, out: str | Path, *, progress: bool = True) -> dict:
    """Write ``run_dir``'s newest intact checkpoint to the folder ``out``; return what
    was written (``step``, ``tensors``, ``copied``)."""
    from depthbench.model.residual.protocol import registry
    from depthbench.run import open_run

    what = "export-hf"
    out = output_paths.check_out(out, what)
    run = open_run(run_dir, what)
    family, baseline = run.spec.family, registry.baseline()
    if family != baseline:
        raise ConfigError(f"{what}: a {family} run is not a Llama (only {baseline} runs, the "
                          "plain LLaMA decoder, are); export-olmo writes the original "
                          "DepthBench's format")
    save_file = _save_file()
    files = run.tokenizer_files()
    tok_config = _tokenizer_config(run, files)
    loaded = run.load()
    tensors = hf_tensors(loaded.host_params(), run.spec)
    if progress:
        print(f"{what}: writing {len(tensors)} tensors to {out}", flush=True)
    with output_paths.built_aside(out, what, "exporting") as work:
        save_file(tensors, str(work / WEIGHTS), metadata={"format": "pt"})
        config = llama_config(run.spec, int(run.config.train.seq_len), run.resolved)
        (work / "config.json").write_text(json.dumps(config, indent=1))
        for name, src in files.items():
            confine.copy_file(src, work / name, run_writer.TOKENIZER_LIMIT, f"{what}: {name}")
        if tok_config is not None:
            (work / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1))
    return {"step": loaded.step, "tensors": len(tensors),
            "copied": sorted(files) + (["tokenizer_config.json"] if tok_config else [])}
