"""Checkpoints and run directories from someone else, crafted to hurt, as a table (issue 48).

Three sources, each small and built once per test module (:class:`Sources`):
``olmo``, a copy of the original's pre_ln step directory
(``tests/fixtures/original_checkpoints``); ``hf``, a tiny Hugging Face Llama
written with ``safetensors.numpy``; ``run``, a depthbench run directory
(import-hf of ``hf``).  A case copies one, damages the copy (``damage(src,
scratch)``: ``scratch`` holds a file of secrets outside it) and runs one
command on it (``argv(src, out)``); each must give exit status 2, one line
matching its pattern, nothing written and nothing copied
(tests/unit/test_trust_boundary.py).  :data:`CASES` groups them by the
class of the attack (``kind``): ``confine`` (reading or copying outside the
directory), ``bounds`` (sizes declared beyond what is there), ``cover``
(a split tensor with a gap or an overlap), ``schema`` (a field of the
wrong type or range), ``unpickle`` (a pickle changing the reader's own
objects).

The original's format is forged here without torch (:func:`torch_save`,
:func:`write_distcp`): each model tensor a ``torch.save`` archive in one
data file, the ``.metadata`` pickle written opcode by opcode from plain
:class:`Entry` records a case edits first.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import re
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import original_outputs

SECRET = "DEPTHBENCH_TEST_SECRET=hunter2"
GIB = 1 << 30


# ------------------------------------------------------- the original's format


def _p(value) -> bytes:
    """A plain value's opcodes (protocol 2, without its header and STOP)."""
    return pickle.dumps(value, protocol=2)[2:-1]


def _global(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def _call(fn: bytes, *args: bytes) -> bytes:
    return fn + b"(" + b"".join(args) + b"tR"


def _record(module: str, name: str, state: dict[str, bytes], extra: bytes = b"") -> bytes:
    """``module.name`` built by NEWOBJ and filled by BUILD from ``state``."""
    items = b"".join(_p(k) + v for k, v in state.items())
    return _global(module, name) + b")\x81}(" + items + extra + b"ub"


def _dict(items: list[tuple[bytes, bytes]]) -> bytes:
    return b"}(" + b"".join(k + v for k, v in items) + b"u"


def _list(items: list[bytes]) -> bytes:
    return b"](" + b"".join(items) + b"e"


META = "torch.distributed.checkpoint.metadata"


@dataclasses.dataclass
class Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str = "__0_0.distcp"
    start: int = 0
    length: int = 0


@dataclasses.dataclass
class Entry:
    shape: tuple[int, ...]
    chunks: list[Chunk]
    dtype: str = "float32"


def index_pickle(entries: dict[str, Entry], *, properties: bytes = b"",
                 extra_field: bytes = b"") -> bytes:
    """``.metadata`` as torch's writer pickles it, of ``entries`` (fqn -> Entry);
    ``properties``: opcodes run right after each TensorProperties is built
    (a case's BUILD); ``extra_field``: more state items of the Metadata."""
    def size(values) -> bytes:
        return _call(_global("torch", "Size"), _p(tuple(values)))

    def tensor(e: Entry) -> bytes:
        props = (_global(META, "TensorProperties") + b")\x81(" + _global("torch", e.dtype)
                 + _call(_global("torch.serialization", "_get_layout"), _p("torch.strided"))
                 + _p(False) + _call(_global(META, "_MEM_FORMAT_ENCODING"), _p(0)) + _p(False)
                 + b"tb" + properties)
        chunks = [_record(META, "ChunkStorageMetadata", {"offsets": size(c.offsets),
                                                         "sizes": size(c.sizes)})
                  for c in e.chunks]
        return _record(META, "TensorStorageMetadata", {"properties": props,
                                                        "size": size(e.shape),
                                                        "chunks": _list(chunks)})

    storage = [(_record(META, "MetadataIndex", {"fqn": _p(fqn), "offset": size(c.offsets),
                                                 "index": _p(None)}),
                _record("torch.distributed.checkpoint.filesystem", "_StorageInfo", {
                    "relative_path": _p(c.file), "offset": _p(c.start), "length": _p(c.length)}))
               for fqn, e in entries.items() for c in e.chunks]
    body = _record(META, "Metadata", {
        "state_dict_metadata": _dict([(_p(fqn), tensor(e)) for fqn, e in entries.items()]),
        "planner_data": _p(None), "storage_data": _dict(storage), "storage_meta": _p(None),
        "version": _p("1.0.0")}, extra_field)
    return b"\x80\x02" + body + b"."


def tensor_pickle(shape: tuple[int, ...], numel: int, *, storage: str = "FloatStorage") -> bytes:
    """The data.pkl torch.save writes for a C-ordered tensor of ``shape`` over a
    storage of ``numel`` elements, opcode by opcode."""
    def ints(values) -> bytes:
        return b"(" + b"".join(b"J" + struct.pack("<i", v) for v in values) + b"t"

    strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    pid = (b"(" + _p("storage") + _global("torch", storage) + _p("0") + _p("cpu")
           + _p(numel) + b"tQ")
    return (b"\x80\x02" + _global("torch._utils", "_rebuild_tensor_v2") + b"(" + pid
            + _p(0) + ints(shape) + ints(strides) + b"\x89"
            + _global("collections", "OrderedDict") + b")R" + b"tR.")


def torch_save(x: np.ndarray, *, pad: int = 0, storage_member: Callable | None = None) -> bytes:
    """A torch.save archive of the float32 array ``x`` (``pad``: bytes of an extra
    stored member; ``storage_member(zipfile, name, data)``: how the storage is
    written, stored by default)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", tensor_pickle(x.shape, x.size))
        z.writestr("archive/byteorder", "little")
        data = np.ascontiguousarray(x, np.float32).tobytes()
        (storage_member or (lambda zf, n, d: zf.writestr(n, d)))(z, "archive/data/0", data)
        if pad:
            z.writestr("archive/pad", b"\0" * pad)
    return buf.getvalue()


def write_distcp(directory: Path, tensors: dict[str, np.ndarray],
                 split: dict[str, list[tuple[tuple, tuple]]] | None = None,
                 archive: Callable[[str, np.ndarray], bytes] | None = None
                 ) -> dict[str, Entry]:
    """``directory/__0_0.distcp`` holding every array of ``tensors`` (fqn -> array),
    one chunk each or the boxes ``split`` gives (``(offsets, sizes)``, each
    chunk's data taken from that box of the array; ``archive(fqn, part)``: its
    bytes, :func:`torch_save` by default), and the entries to pickle into
    ``.metadata`` (:func:`write_index`)."""
    directory.mkdir(parents=True, exist_ok=True)
    entries, blob = {}, bytearray()
    for fqn, x in tensors.items():
        boxes = (split or {}).get(fqn, [((0,) * x.ndim, x.shape)])
        chunks = []
        for offsets, sizes in boxes:
            part = x[tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))]
            data = (archive or (lambda f, a: torch_save(a)))(fqn, part)
            chunks.append(Chunk(tuple(offsets), tuple(sizes), start=len(blob), length=len(data)))
            blob += data
        entries[fqn] = Entry(tuple(x.shape), chunks)
    (directory / "__0_0.distcp").write_bytes(bytes(blob))
    return entries


def write_index(directory: Path, entries: dict[str, Entry], **kw) -> None:
    (directory / ".metadata").write_bytes(index_pickle(entries, **kw))


_ORIGINAL: dict[str, np.ndarray] = {}


def original_tensors() -> dict[str, np.ndarray]:
    """The model tensors of the original's pre_ln step (fqn -> float32 array)."""
    if not _ORIGINAL:
        from depthbench.formats.olmo.distcp import DistCheckpoint

        ckpt = DistCheckpoint(original_outputs.step_dir("pre_ln") / "model_and_optim")
        _ORIGINAL.update({f"model.{k}": np.array(ckpt.read(k)) for k in ckpt.tensors})
    return _ORIGINAL


def reforge(step: Path, edit: Callable[[Path, dict[str, Entry]], None] | None = None, *,
            split=None, archive=None, **index_kw) -> None:
    """Replace ``step/model_and_optim`` by a forged checkpoint of the same model
    tensors (``split``, ``archive``: :func:`write_distcp`'s; ``edit(directory,
    entries)``: changes before the index is pickled)."""
    directory = step / "model_and_optim"
    shutil.rmtree(directory)
    entries = write_distcp(directory, original_tensors(), split=split, archive=archive)
    if edit is not None:
        edit(directory, entries)
    write_index(directory, entries, **index_kw)


EMBED = "model.embeddings.weight"  # [128, 48] in the pre_ln fixture


# ---------------------------------------------------------- a Hugging Face Llama

HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
             "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "vocab_size": 300, "rms_norm_eps": 1e-5,
             "rope_theta": 10000.0, "max_position_embeddings": 64, "hidden_act": "silu",
             "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}


def write_hf(path: Path, tokenizer: Path) -> Path:
    """A tiny random Llama checkpoint (safetensors, no torch) with ``tokenizer``."""
    from safetensors.numpy import save_file

    from depthbench.formats.hf import tensor_map

    c = HF_CONFIG
    rng = np.random.default_rng(0)
    tensors = {e.hf: rng.normal(0, 0.1, e.hf_shape).astype(np.float32)
               for e in tensor_map(c["num_hidden_layers"], c["hidden_size"],
                                   c["intermediate_size"], c["num_attention_heads"],
                                   c["num_key_value_heads"], c["vocab_size"])}
    path.mkdir(parents=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(c))
    shutil.copy(tokenizer, path / "tokenizer.json")
    return path


# ------------------------------------------------------------------ the sources


@dataclasses.dataclass(frozen=True)
class Sources:
    """The pristine inputs a case copies: ``olmo`` (a step directory), ``hf`` (a
    checkpoint folder), ``run`` (a run directory)."""

    olmo: Path
    hf: Path
    run: Path


def build_sources(root: Path) -> Sources:
    from eval_tiny import tiny_tokenizer

    from depthbench.formats.hf import import_hf

    olmo = root / "olmo" / "step1"
    shutil.copytree(original_outputs.step_dir("pre_ln"), olmo)
    hf = write_hf(root / "hf", tiny_tokenizer(root / "tok"))
    import_hf(hf, root / "run", progress=False)
    return Sources(olmo, hf, root / "run")


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def sparse(path: Path, size: int) -> None:
    """``path`` replaced by a file of ``size`` bytes that holds none (a hole)."""
    path.unlink(missing_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def link(path: Path, target: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.symlink_to(target)


def safetensors_header(path: Path, header: dict, data: bytes = b"") -> None:
    """``path`` a safetensors file of ``header`` (its JSON) and ``data``."""
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def moved_out(path: Path, scratch: Path) -> None:
    """``path`` moved out of the checkpoint into ``scratch``, a link to it left in
    its place."""
    target = scratch / f"moved_{path.name}"
    shutil.move(path, target)
    path.symlink_to(target)


def secret_link(path: Path, scratch: Path) -> None:
    """``path`` a link to a file of secrets outside the checkpoint."""
    (scratch / "secret").write_text(SECRET)
    link(path, scratch / "secret")


def nested(depth: int) -> str:
    return '{"model": ' + "[" * depth + "]" * depth + "}"


def _config(step: Path, change: Callable[[dict], None]) -> None:
    edit_json(step / "config.json", change)


def _olmo_model(change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    return lambda s, _: _config(s, lambda c: change(c["model"]))


def _hf(change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    return lambda s, _: edit_json(s / "config.json", change)


def _outside(scratch: Path) -> Path:
    """A directory beside the checkpoint holding what a link may point at."""
    where = scratch / "outside"
    where.mkdir(exist_ok=True)
    return where


def _step_of(run: Path) -> Path:
    return next(p for p in (run / "checkpoints").iterdir() if p.name.isdigit())


def _integrity(run: Path, change: Callable[[dict], None]) -> None:
    edit_json(_step_of(run) / "integrity.json", change)


def _split_embed(boxes):
    return lambda s, _: reforge(s, split={EMBED: boxes})


def _zip_bomb(declared: int):
    """An embedding archive whose storage member deflates from a few bytes to
    16 MiB and declares ``declared`` bytes (the archive padded to the chunk's
    size)."""
    def storage(z, name, data):
        info = zipfile.ZipInfo(name)
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, b"\0" * (16 << 20))

    def archive(fqn, x):
        if fqn != EMBED:
            return torch_save(x)
        blob = bytearray(torch_save(x, storage_member=storage, pad=x.nbytes))
        at = blob.rfind(b"PK\x01\x02", 0, blob.rfind(b"archive/data/0") + 1)
        struct.pack_into("<I", blob, at + 24, declared)  # the central directory's size field
        return bytes(blob)

    return lambda s, _: reforge(s, archive=archive)


def _chunk(change: Callable[[Chunk], None], fqn: str = EMBED):
    return lambda s, _: reforge(s, lambda d, e: change(e[fqn].chunks[0]))


def _embed_shape(shape):
    def edit(directory, entries):
        entries[EMBED].shape = entries[EMBED].chunks[0].sizes = shape
    return lambda s, _: reforge(s, edit)


def _many_members(s, _):
    def archive(fqn, x):
        if fqn != EMBED:
            return torch_save(x)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for i in range(x.nbytes // 64):
                z.writestr(f"m{i}", b"")
        return buf.getvalue()
    reforge(s, archive=archive)


def _import_olmo(s: Path, out: Path) -> list[str]:
    return ["import-olmo", str(s), "--out", str(out), "--no-progress"]


def _import_hf(s: Path, out: Path) -> list[str]:
    return ["import-hf", str(s), "--out", str(out), "--no-progress"]


def _export_hf(s: Path, out: Path) -> list[str]:
    return ["export-hf", str(s), "--out", str(out), "--no-progress"]


def _export_olmo(s: Path, out: Path) -> list[str]:
    return ["export-olmo", str(s), "--out", str(out), "--no-progress"]


def _generate(s: Path, out: Path) -> list[str]:
    return ["generate", str(s), "--prompt", "hi", "--max-new-tokens", "1", "--no-progress"]


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    kind: str  # confine, bounds, cover, schema, unpickle
    source: str  # olmo, hf, run
    damage: Callable[[Path, Path], None]  # (the copy, the scratch directory)
    argv: Callable[[Path, Path], list[str]]  # (the copy, --out)
    pattern: str  # what the one line says


# Fields of an HF config.json of the wrong type or range: (field, value, what the line allows).
HF_FIELDS = [("num_attention_heads", 0, r"an integer >= 1"),
             ("hidden_size", True, r"an integer >= 1"),
             ("rms_norm_eps", "abc", r"a positive number"),
             ("rms_norm_eps", -1e-6, r"a positive number"),
             ("rope_scaling", "yarn", r"an object \(or null\)"),
             ("rope_theta", [1], r"a positive number"),
             ("architectures", 5, r"a list of class names"),
             ("tie_word_embeddings", "yes", r"true or false"),
             ("hidden_act", ["silu"], r"text"),
             ("eos_token_id", "</s>", r"a token id from 0 to 299 \(or null\)")]

# A file or folder of the input moved out and a link to it left in its place:
# (id, source, its path in the source, argv, pattern of the line).
MOVED_OUT = [
    ("import-olmo: model_and_optim a link out", "olmo", "model_and_optim", _import_olmo,
     r"import-olmo: model_and_optim: \S+ is a symbolic link"),
    ("import-olmo: .metadata a link", "olmo", "model_and_optim/.metadata", _import_olmo,
     r"import-olmo: \.metadata: \S+/\.metadata is a symbolic link"),
    ("import-olmo: a data file a link", "olmo", "model_and_optim/__0_0.distcp", _import_olmo,
     r"a data file: \S+/__0_0\.distcp is a symbolic link"),
    ("import-olmo: config.json a link", "olmo", "config.json", _import_olmo,
     r"import-olmo: config\.json: \S+/config\.json is a symbolic link"),
    ("import-hf: model.safetensors a link out", "hf", "model.safetensors", _import_hf,
     r"model\.safetensors is a symbolic link; links are not followed"),
    ("import-hf: config.json a link", "hf", "config.json", _import_hf,
     r"import-hf: config\.json: \S+/config\.json is a symbolic link"),
    ("export-hf: the run's config.json a link", "run", "config.json", _export_hf,
     r"config\.json: is a symbolic link"),
    ("export-hf: the run's checkpoints/ a link out", "run", "checkpoints", _export_hf,
     r"RUN_DIR: \S+/checkpoints is a symbolic link"),
    ("export-hf: a checkpoint step a link out", "run", "checkpoints/0", _export_hf,
     r"\(step 0: it is a symbolic link"),
]

NOT_INTACT = r"none of the 1 checkpoint\(s\) in \S+ is intact \(step 0: "

CASES = [
    # ------------------------------------------------ confine: reads and copies stay inside
    *(Case(id, "confine", source, lambda s, x, w=which: moved_out(s / w, x), argv, pattern)
      for id, source, which, argv, pattern in MOVED_OUT),
    Case("import-olmo: tokenizer.json a link to /proc/self/environ", "confine", "olmo",
         lambda s, x: (s.parent / "tokenizer").mkdir() or link(
             s.parent / "tokenizer" / "tokenizer.json", Path("/proc/self/environ")),
         _import_olmo, r"import-olmo: tokenizer/tokenizer\.json: \S+ is a symbolic link"),
    Case("import-olmo: the tokenizer folder a link out", "confine", "olmo",
         lambda s, x: (secret_link(_outside(x) / "tokenizer.json", x),
                       link(s / "tokenizer", _outside(x))),
         _import_olmo, r"import-olmo: tokenizer folder: \S+/tokenizer is a symbolic link"),
    Case("import-olmo: a data file named ../ in .metadata", "confine", "olmo",
         _chunk(lambda c: setattr(c, "file", "../secret.distcp")), _import_olmo,
         r"\.metadata is damaged or not a torch checkpoint index \(ValueError: bad storage "
         r"record for model\.embeddings\.weight\)"),
    Case("import-olmo: a data file named by its absolute path", "confine", "olmo",
         _chunk(lambda c: setattr(c, "file", "/etc/passwd")), _import_olmo,
         r"bad storage record for model\.embeddings\.weight"),
    Case("import-hf: tokenizer.json a link to a secret", "confine", "hf",
         lambda s, x: secret_link(s / "tokenizer.json", x), _import_hf,
         r"import-hf: tokenizer\.json: \S+/tokenizer\.json is a symbolic link"),
    Case("import-hf: tokenizer.model a FIFO", "confine", "hf",
         lambda s, x: os.mkfifo(s / "tokenizer.model"), _import_hf,
         r"import-hf: tokenizer\.model: \S+/tokenizer\.model is not a regular file$"),
    Case("import-hf: weight_map names ../outside.safetensors", "confine", "hf",
         lambda s, x: shutil.copy(s / "model.safetensors", x / "outside.safetensors") and (
             s / "model.safetensors.index.json").write_text(json.dumps(
                 {"weight_map": {"lm_head.weight": "../outside.safetensors"}})),
         _import_hf, r"weight_map: '\.\./outside\.safetensors' is not a path inside"),
    Case("import-hf: weight_map names an absolute path", "confine", "hf",
         lambda s, x: (s / "model.safetensors.index.json").write_text(json.dumps(
             {"weight_map": {"lm_head.weight": str(s / "model.safetensors")}})),
         _import_hf, r"weight_map: '/\S+' is not a path inside"),
    Case("export-hf: the run's tokenizer.json a link to /proc/self/environ", "confine", "run",
         lambda s, x: link(s / "tokenizer.json", Path("/proc/self/environ")), _export_hf,
         r"\S+/run: tokenizer\.json: \S+/tokenizer\.json is a symbolic link"),
    Case("export-olmo: the run's tokenizer.json a link to a secret", "confine", "run",
         lambda s, x: secret_link(s / "tokenizer.json", x), _export_olmo,
         r"\S+/run: tokenizer\.json: \S+/tokenizer\.json is a symbolic link"),
    Case("export-hf: the run's recorded tokenizer a secret elsewhere", "confine", "run",
         lambda s, x: ((s / "tokenizer.json").unlink(), (x / "secret").write_text(SECRET),
                       edit_json(s / "config.json", lambda c: c["resolved"]["tokenizer"].update(
                           tokenizer_path=str(x / "secret")))),
         _export_hf, r"resolved\.tokenizer\.tokenizer_path"),
    Case("export-hf: a file of a step a link", "confine", "run",
         lambda s, x: link(_step_of(s) / "commit_success.txt", Path("/proc/self/environ")),
         _export_hf, NOT_INTACT + r"commit_success\.txt is a symbolic link"),
    Case("generate: integrity.json names ../../config.json", "confine", "run",
         lambda s, x: _integrity(s, lambda r: r["files"].update(
             {"../../config.json": [1, "0" * 64]})),
         _generate, NOT_INTACT + r"integrity\.json names '\.\./\.\./config\.json', which is not "
         r"a path inside the step"),
    # ----------------------------------------- bounds: declared sizes, before allocation
    Case("import-olmo: a .metadata of 2 GiB", "bounds", "olmo",
         lambda s, x: sparse(s / "model_and_optim" / ".metadata", 2 * GIB), _import_olmo,
         r"\.metadata: \S+ holds 2,147,483,648 bytes; at most 16,777,216 are read$"),
    Case("import-olmo: a config.json of 1 GiB", "bounds", "olmo",
         lambda s, x: sparse(s / "config.json", GIB), _import_olmo,
         r"import-olmo: \S+/config\.json: holds 1,073,741,824 bytes; at most 67,108,864 are "
         r"read$"),
    Case("import-olmo: n_layers 10**7, a 4-layer checkpoint", "bounds", "olmo",
         _olmo_model(lambda m: m.update(n_layers=10**7)), _import_olmo,
         r"model\.n_layers is 10,000,000; the checkpoint holds 4 blocks"),
    Case("import-olmo: vocab_size beyond its embedding", "bounds", "olmo",
         _olmo_model(lambda m: m.update(vocab_size=10**9)), _import_olmo,
         r"model\.vocab_size x model\.d_model is 1,000,000,000 x 48; the checkpoint's "
         r"embeddings\.weight is 128 x 48"),
    Case("import-olmo: hidden_size beyond what the checkpoint holds", "bounds", "olmo",
         _olmo_model(lambda m: m["block"]["feed_forward"].update(hidden_size=10**9)),
         _import_olmo, r"model\.block\.feed_forward\.hidden_size 1,000,000,000 with its other "
         r"widths declares [\d,]+ backbone parameters; the checkpoint holds [\d,]+ elements"),
    Case("import-olmo: a tensor declaring 10**12 elements", "bounds", "olmo",
         _embed_shape((10**6, 10**6)), _import_olmo,
         r"model\.embeddings\.weight's chunk at \(0, 0\) declares 4,000,000,000,000 bytes of "
         r"data in a record of [\d,]+"),
    Case("import-olmo: a chunk record of 2 GiB", "bounds", "olmo",
         lambda s, x: reforge(s, lambda d, e: (setattr(e[EMBED].chunks[0], "length", 2 * GIB),
                                               sparse(d / "big.distcp", 3 * GIB),
                                               setattr(e[EMBED].chunks[0], "file",
                                                       "big.distcp"))),
         _import_olmo, r"declares 24,576 bytes of data in a record of 2,147,483,648"),
    Case("import-olmo: a zip member inflating to 2 GiB", "bounds", "olmo", _zip_bomb(2 * GIB),
         _import_olmo, r"entry model\.embeddings\.weight cannot be read, the checkpoint is "
         r"damaged \(UnpicklingError: archive/data/0 inflates to 2,147,483,648 bytes; at most "
         r"24,576 expected\)"),
    Case("import-olmo: a zip member deflating past what it declares", "bounds", "olmo",
         _zip_bomb(24_576), _import_olmo, r"UnpicklingError: archive/data/0 is compressed "
         r"\(zip method 8\); torch\.save stores its members\)"),
    Case("import-olmo: an archive of thousands of members", "bounds", "olmo", _many_members,
         _import_olmo, r"an archive of 384 members; at most 64 are read"),
    Case("import-olmo: a .metadata of a million empty dicts", "bounds", "olmo",
         lambda s, x: (s / "model_and_optim" / ".metadata").write_bytes(
             b"\x80\x04]" + b"}a" * 4_000_001 + b"."), _import_olmo,
         r"\.metadata is damaged .*\(UnpicklingError: more than 4,000,000 opcodes\)"),
    Case("import-olmo: a .metadata of four million memo entries", "bounds", "olmo",
         lambda s, x: (s / "model_and_optim" / ".metadata").write_bytes(
             b"\x80\x04]" + b"\x94" * 4_000_001 + b"."), _import_olmo,
         r"\.metadata is damaged .*\(UnpicklingError: more than 4,000,000 opcodes\)"),
    Case("import-olmo: sequence_length 10**12", "bounds", "olmo",
         lambda s, x: _config(s, lambda c: c["dataset"].update(sequence_length=10**12)),
         _import_olmo, r"dataset\.sequence_length must be an integer from 1 to 16,777,216 "
         r"\(tokens\), got 1000000000000$"),
    Case("import-hf: a config.json of 1 GiB", "bounds", "hf",
         lambda s, x: sparse(s / "config.json", GIB), _import_hf,
         r"import-hf: \S+/config\.json: holds 1,073,741,824 bytes"),
    Case("import-hf: an index of 1 GiB", "bounds", "hf",
         lambda s, x: sparse(s / "model.safetensors.index.json", GIB), _import_hf,
         r"import-hf: \S+/model\.safetensors\.index\.json: holds 1,073,741,824 bytes"),
    Case("import-hf: num_hidden_layers 10**7, a 2-layer checkpoint", "bounds", "hf",
         _hf(lambda c: c.update(num_hidden_layers=10**7)), _import_hf,
         r"num_hidden_layers is 10,000,000; the checkpoint holds 2 blocks"),
    Case("import-hf: a tensor declaring 10**12 elements", "bounds", "hf",
         lambda s, x: safetensors_header(s / "model.safetensors", {"model.embed_tokens.weight": {
             "dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 16]}}, b"\0" * 16),
         _import_hf, r"model\.safetensors is not a readable safetensors file"),
    Case("import-hf: a header of 2 GiB", "bounds", "hf",
         lambda s, x: (sparse(s / "model.safetensors", 3 * GIB), (s / "model.safetensors")
                       .open("r+b").write((2 * GIB).to_bytes(8, "little"))),
         _import_hf, r"model\.safetensors is not a readable safetensors file"),
    Case("import-hf: vocab_size beyond the embedding", "bounds", "hf",
         _hf(lambda c: c.update(vocab_size=10**9)), _import_hf,
         r"vocab_size x hidden_size is 1,000,000,000 x 16; the checkpoint's "
         r"embed_tokens\.weight is 300 x 16"),
    Case("import-hf: max_position_embeddings 10**12", "bounds", "hf",
         _hf(lambda c: c.update(max_position_embeddings=10**12)), _import_hf,
         r"max_position_embeddings must be an integer from 1 to 16,777,216"),
    Case("export-hf: the run's config.json of 1 GiB", "bounds", "run",
         lambda s, x: sparse(s / "config.json", GIB), _export_hf,
         r"config\.json: holds 1,073,741,824 bytes; at most 67,108,864 are read"),
    Case("export-hf: the run's depth 10**7", "bounds", "run",
         lambda s, x: edit_json(s / "config.json", lambda c: (
             c["model"].update(depth=10**7), c["resolved"]["shape"].update(depth=10**7))),
         _export_hf, NOT_INTACT + r"the reader failed \(ValueError: it holds parameter "
         r"\['blocks'\]\['attn'\]\['k'\] of shape \(2, 16, 1, 8\), config\.json's model "
         r"\(10000000, 16, 1, 8\)\)"),
    Case("generate: an integrity.json of 1 GiB", "bounds", "run",
         lambda s, x: sparse(_step_of(s) / "integrity.json", GIB), _generate,
         NOT_INTACT + r"integrity\.json holds 1,073,741,824 bytes"),
    # ---------------------------------------------- cover: each element exactly once
    Case("import-olmo: two chunks at one offset, sizes adding up", "cover", "olmo",
         _split_embed([((0, 0), (64, 48)), ((0, 0), (64, 48))]), _import_olmo,
         r"entry model\.embeddings\.weight of shape \(128, 48\): its chunks at \(0, 0\) and "
         r"\(0, 0\) overlap"),
    Case("import-olmo: two chunks overlapping by a row", "cover", "olmo",
         _split_embed([((0, 0), (65, 48)), ((64, 0), (64, 48))]), _import_olmo,
         r"its chunks at \(0, 0\) and \(64, 0\) overlap"),
    Case("import-olmo: a row no chunk covers", "cover", "olmo",
         _split_embed([((0, 0), (64, 48)), ((65, 0), (63, 48))]), _import_olmo,
         r"its chunks cover 6,096 of its 6,144 elements"),
    Case("import-olmo: a chunk past the tensor's end", "cover", "olmo",
         lambda s, x: reforge(s, lambda d, e: setattr(e[EMBED].chunks[0], "offsets", (1, 0))),
         _import_olmo, r"the chunk at \(1, 0\) of \(128, 48\) reaches past its shape \(128, 48\)"),
    Case("import-olmo: a chunk of another rank", "cover", "olmo",
         lambda s, x: reforge(s, lambda d, e: setattr(e[EMBED], "shape", (128, 48, 1))),
         _import_olmo, r"the chunk at \(0, 0\) has 2 dimensions, the tensor 3"),
    # --------------------------------------------------- schema: one line per field
    Case("import-olmo: config.json nested 100,000 deep", "schema", "olmo",
         lambda s, x: (s / "config.json").write_text(nested(100_000)), _import_olmo,
         r"config\.json: nests deeper than 64 levels$"),
    Case("import-olmo: config.json nested 65 deep", "schema", "olmo",
         lambda s, x: (s / "config.json").write_text(nested(64)), _import_olmo,
         r"config\.json: nests deeper than 64 levels$"),
    Case("import-olmo: sequence_length text", "schema", "olmo",
         lambda s, x: _config(s, lambda c: c["dataset"].update(sequence_length="long")),
         _import_olmo, r"dataset\.sequence_length must be an integer from 1 to 16,777,216 "
         r"\(tokens\), got long$"),
    Case("import-olmo: eos_token_id text", "schema", "olmo",
         lambda s, x: _config(s, lambda c: c["dataset"]["tokenizer"].update(eos_token_id="x")),
         _import_olmo, r"dataset\.tokenizer\.eos_token_id must be a token id from 0 to 127 "
         r"\(or null\), got x$"),
    Case("import-olmo: n_layers text", "schema", "olmo",
         _olmo_model(lambda m: m.update(n_layers="four")), _import_olmo,
         r"model\.n_layers must be an integer >= 1, got 'four'$"),
    Case("import-olmo: an index field torch never writes", "schema", "olmo",
         lambda s, x: reforge(s, extra_field=_p("shell") + _p("rm -rf ~")), _import_olmo,
         r"\.metadata is damaged .*\(UnpicklingError: Metadata has no field 'shell'\)"),
    Case("import-hf: config.json nested 100,000 deep", "schema", "hf",
         lambda s, x: (s / "config.json").write_text(nested(100_000)), _import_hf,
         r"import-hf: \S+/config\.json: nests deeper than 64 levels$"),
    Case("import-hf: an index that is not JSON", "schema", "hf",
         lambda s, x: (s / "model.safetensors.index.json").write_text("{"), _import_hf,
         r"import-hf: \S+/model\.safetensors\.index\.json: is not JSON"),
    *(Case(f"import-hf: {what}", "schema", "hf",
           lambda s, x, i=index: (s / "model.safetensors.index.json").write_text(json.dumps(i)),
           _import_hf, r"weight_map must be a JSON object of tensor name -> file name "
           r"\(strings\)$")
      for what, index in (("an index without weight_map", {}),
                          ("weight_map a list", {"weight_map": ["model.safetensors"]}),
                          ("weight_map a number", {"weight_map": {"lm_head.weight": 5}}))),
    *(Case(f"import-hf: {field} {value!r}", "schema", "hf",
           _hf(lambda c, f=field, v=value: c.update({f: v})), _import_hf,
           rf"{re.escape(field)} must be {allowed}, got {re.escape(str(value))}$")
      for field, value, allowed in HF_FIELDS),
    Case("import-hf: rope_scaling's type a number", "schema", "hf",
         _hf(lambda c: c.update(rope_scaling={"type": 3})), _import_hf,
         r"rope_scaling\.type must be text, got 3$"),
    Case("export-hf: the run's config.json nested 100,000 deep", "schema", "run",
         lambda s, x: (s / "config.json").write_text(nested(100_000)), _export_hf,
         r"config\.json: nests deeper than 64 levels$"),
    *(Case(f"export-hf: the run's {field} as {value!r}", "schema", "run",
           lambda s, x, f=field, v=value: edit_json(s / "config.json", lambda c: c[f.split(".")[0]]
                                                     .update({f.split(".")[1]: v})),
           _export_hf, rf"config\.json: {re.escape(field)}: expected {kind}, got ")
      for field, value, kind in (("model.depth", "2", "int"), ("model.norm_eps", [1], "float"),
                                 ("model.family", 5, "str"), ("train.seq_len", 1.5, "int"))),
    Case("generate: the run's resolved.tokenizer a list", "schema", "run",
         lambda s, x: edit_json(s / "config.json", lambda c: c.update(
             resolved={**c["resolved"], "tokenizer": [1]})), _generate,
         r"config\.json: resolved \(and its tokenizer\): expected a JSON object$"),
    Case("generate: the run's eos_id as text", "schema", "run",
         lambda s, x: edit_json(s / "config.json", lambda c: c["resolved"]["tokenizer"].update(
             eos_id="2")), _generate,
         r"config\.json: resolved\.tokenizer\.eos_id: expected an integer id \(-1: none\), "
         r"got '2'$"),
    Case("generate: an integrity.json entry not [size, hash]", "schema", "run",
         lambda s, x: _integrity(s, lambda r: r["files"].update(
             {"commit_success.txt": "fine"})), _generate,
         NOT_INTACT + r"integrity\.json: files\['commit_success\.txt'\] must be \[size, sha256\]"),
    Case("generate: integrity.json files a list", "schema", "run",
         lambda s, x: _integrity(s, lambda r: r.update(files=["commit_success.txt"])),
         _generate, NOT_INTACT + r"integrity\.json: files must be an object of path -> "
         r"\[size, sha256\]"),
    Case("generate: integrity.json not JSON", "schema", "run",
         lambda s, x: (_step_of(s) / "integrity.json").write_text("{"), _generate,
         NOT_INTACT + r"integrity\.json is not JSON"),
    # ------------------------------------------- unpickle: the reader's objects stay its own
    Case("import-olmo: .metadata renames torch.float32", "unpickle", "olmo",
         lambda s, x: reforge(s, properties=_global("torch", "float32") + _p(
             (None, {"name": "float64"})) + b"b0"), _import_olmo,
         r"\.metadata is damaged .*\(UnpicklingError: the pickle tries to change "
         r"Constant\('float32'\)\)"),
    Case("import-olmo: .metadata renames a depthbench function", "unpickle", "olmo",
         lambda s, x: reforge(s, properties=_global("torch", "Size") + _p(
             (None, {"__qualname__": "pwned"})) + b"b0"), _import_olmo,
         r"the pickle tries to change <stand-in of torch\.Size>"),
    Case("import-olmo: .metadata changes an allowed class", "unpickle", "olmo",
         lambda s, x: reforge(s, properties=_global(META, "ChunkStorageMetadata") + _p(
             {"kind": "x"}) + b"b0"), _import_olmo,
         r"UnpicklingError: the pickle tries to change an allowed class"),
    Case("import-olmo: .metadata made of sets", "unpickle", "olmo",
         lambda s, x: (s / "model_and_optim" / ".metadata").write_bytes(
             b"\x80\x04]" + b"\x8fa" * 1000 + b"."), _import_olmo,
         r"UnpicklingError: opcode EMPTY_SET, which torch's pickles never use"),
]
