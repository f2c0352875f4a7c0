"""A torch distributed checkpoint: read without torch, trusting nothing; written by torch.

OLMo-core's trainer saves ``model.*`` and ``optim.*`` entries with its own
writer (``save_model_and_optim_state``: ``RemoteFileSystemWriter``), in the
layout of ``torch.distributed.checkpoint``'s ``FileSystemWriter``:

* ``.metadata``, a pickle of the index: ``Metadata.state_dict_metadata``
  (every entry: a ``TensorStorageMetadata``, its dtype, size and chunks, or
  a ``BytesStorageMetadata``) and ``Metadata.storage_data`` (each chunk's
  ``_StorageInfo``: data file, byte offset, length).  OLMo-core's writer
  pickles its own ``olmo_core.distributed.checkpoint.filesystem._StorageInfo``
  there, so ``pickle.load`` needs olmo_core installed, and executes whatever
  else the pickle names;
* ``__<rank>_<n>.distcp`` data files: each chunk is a ``torch.save`` archive
  (a zip: ``data.pkl``, a pickle naming ``torch._utils._rebuild_tensor_v2``
  and a storage class, and ``data/<key>``, the raw little-endian storage).

Both pickles are read by :mod:`~depthbench.formats.olmo.unpickle` with
allow-lists of exactly these classes (``INDEX_CLASSES``, ``TENSOR_CLASSES``),
mapped to stand-ins defined here: torch and olmo_core are never imported,
and a pickle naming anything else (``os.system``) is one line naming it,
with nothing run.  A tensor is rebuilt in numpy from its storage bytes, its
offset and strides checked against the storage's size; sharded entries
(FSDP) are assembled from their chunks.  :class:`DistCheckpoint` checks that
every byte range of every model entry lies inside an existing file (a
truncated or missing ``.distcp`` is found before anything is converted) and
reads one entry at a time, so memory holds one tensor beyond what the caller
keeps.  Checkpoints whose chunks are transformed (compressed) by a newer
writer are refused in one line.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from depthbench.errors import ConfigError
from depthbench.formats.olmo.unpickle import Refused, int_tuple, loads, record

WHAT = "import-olmo"
MODEL_PREFIX = "model."

_METADATA = "torch.distributed.checkpoint.metadata"
_STORAGE_INFO = record("_StorageInfo")


def _dtypes() -> dict[str, np.dtype]:
    import ml_dtypes  # installed with jax

    return {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
            "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
            "int64": np.dtype(np.int64), "int32": np.dtype(np.int32),
            "int16": np.dtype(np.int16), "int8": np.dtype(np.int8),
            "uint8": np.dtype(np.uint8), "bool": np.dtype(np.bool_)}


# torch's typed storage classes, as torch.save pickles them, and their dtypes.
_STORAGES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
             "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
             "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
             "BoolStorage": "bool"}


@dataclasses.dataclass(frozen=True)
class _Dtype:
    """A torch dtype (``torch.float32``) or storage class (``torch.FloatStorage``)."""

    name: str


def _layout(name: Any) -> str:
    """``torch.serialization._get_layout("torch.strided")``: dense tensors only."""
    if name != "torch.strided":
        raise pickle.UnpicklingError(f"layout {str(name)[:40]} (only dense tensors are read)")
    return name


def _memory_format(code: Any) -> int:
    """``_MEM_FORMAT_ENCODING(code)``: the enum's int value."""
    if not isinstance(code, int):
        raise pickle.UnpicklingError("memory format is not an int")
    return code


def _path(*parts: Any) -> str:
    """A ``pathlib`` path (torch's writer records ``checkpoint_id`` as one) as text."""
    if not all(isinstance(p, str) for p in parts):
        raise pickle.UnpicklingError("a path made of something other than text")
    return "/".join(parts)


INDEX_CLASSES: dict[tuple[str, str], Any] = {
    **{(_METADATA, name): record(name) for name in (
        "Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata",
        "MetadataIndex", "StorageMeta")},
    (_METADATA, "TensorProperties"): record(
        "TensorProperties", ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")),
    (_METADATA, "_MEM_FORMAT_ENCODING"): _memory_format,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _STORAGE_INFO,
    # OLMo-core's writer pickles its own copy of the class (same fields).
    ("olmo_core.distributed.checkpoint.filesystem", "_StorageInfo"): _STORAGE_INFO,
    ("torch", "Size"): int_tuple,
    ("torch.serialization", "_get_layout"): _layout,
    **{("pathlib", name): _path for name in ("Path", "PosixPath", "WindowsPath",
                                             "PurePosixPath", "PureWindowsPath")},
    **{("torch", name): _Dtype(name) for name in (
        "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
        "uint8", "bool")},
}


@dataclasses.dataclass(frozen=True)
class _Storage:
    data: np.ndarray  # 1-D, the storage's dtype


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> np.ndarray:
    """``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`` as a
    read-only numpy view, every element it addresses inside the storage."""
    size, stride = int_tuple(size), int_tuple(stride)
    if not isinstance(storage, _Storage) or not isinstance(offset, int) or len(size) != len(
            stride):
        raise pickle.UnpicklingError("a tensor record that is not (storage, offset, size, stride)")
    data = storage.data
    reach = sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    last = offset + reach if all(size) else offset - 1
    if offset < 0 or last >= data.size:
        raise pickle.UnpicklingError(f"a tensor reaches element {last} of a storage of "
                                     f"{data.size}")
    if not all(size):
        return np.zeros(size, data.dtype)
    view = np.lib.stride_tricks.as_strided(data[offset:], shape=size,
                                           strides=[s * data.itemsize for s in stride])
    view.flags.writeable = False
    return view


TENSOR_CLASSES: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("collections", "OrderedDict"): dict,  # the (empty) backward hooks
    **{("torch", name): _Dtype(dtype) for name, dtype in _STORAGES.items()},
}


def read_torch_save(blob: bytes) -> Any:
    """The object in a ``torch.save`` archive (a zip), without torch: a tensor as a
    numpy array, or plain Python data (the optimizer's ``param_groups``)."""
    dtypes = _dtypes()
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        names = archive.namelist()
        pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if pkl is None:
            raise pickle.UnpicklingError("no data.pkl in the archive")
        prefix = pkl[: -len("data.pkl")]
        order = (archive.read(prefix + "byteorder").decode() if prefix + "byteorder" in names
                 else "little")
        if order not in ("little", "big"):
            raise pickle.UnpicklingError(f"byte order {order[:20]!r}")

        def storage(pid: Any) -> _Storage:
            if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                    and isinstance(pid[1], _Dtype) and isinstance(pid[2], str)):
                raise pickle.UnpicklingError(f"persistent id {str(pid)[:60]}")
            dtype = dtypes[pid[1].name].newbyteorder("<" if order == "little" else ">")
            raw = archive.read(f"{prefix}data/{pid[2]}")
            if len(raw) % dtype.itemsize:
                raise pickle.UnpicklingError("a storage's size is not a whole number of items")
            return _Storage(np.frombuffer(raw, dtype).astype(dtype.newbyteorder("="),
                                                             copy=False))

        return loads(archive.read(pkl), TENSOR_CLASSES, persistent_load=storage)


def _one_line(e: BaseException) -> str:
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


def _refused(path: Path, what: str) -> ConfigError:
    return ConfigError(f"{WHAT}: {path} names {what}, which a torch checkpoint does not "
                       "hold: refused, nothing in it was run")


@dataclasses.dataclass(frozen=True)
class _Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    start: int
    length: int


class DistCheckpoint:
    """The entries of the distributed checkpoint in ``directory``."""

    def __init__(self, directory: Path):
        self.directory = directory
        meta_path = directory / ".metadata"
        if not meta_path.is_file():
            raise ConfigError(f"{WHAT}: {meta_path} does not exist (expected a torch distributed "
                              "checkpoint: .metadata and *.distcp)")
        try:
            index = loads(meta_path.read_bytes(), INDEX_CLASSES)
            entries = dict(index.state_dict_metadata)
            storage = {(key.fqn, int_tuple(getattr(key, "offset", None) or ())): info
                       for key, info in dict(getattr(index, "storage_data", None) or {}).items()}
            self.entries = {fqn: self._entry(fqn, entry, storage) for fqn, entry in
                            entries.items()}
        except Refused as e:
            raise _refused(meta_path, e.what) from None
        except Exception as e:  # any other failure of an untrusted index means damaged
            raise ConfigError(f"{WHAT}: {meta_path} is damaged or not a torch checkpoint index "
                              f"({_one_line(e)})") from None
        # model tensors without the prefix: (shape, dtype name)
        self.tensors: dict[str, tuple[tuple[int, ...], str]] = {
            fqn[len(MODEL_PREFIX):]: (entry[0], entry[1]) for fqn, entry in self.entries.items()
            if fqn.startswith(MODEL_PREFIX) and entry[1] is not None}
        if not self.tensors:
            raise ConfigError(f"{WHAT}: {meta_path} lists no model.* tensors")
        self._check_files([fqn for fqn in self.entries if fqn.startswith(MODEL_PREFIX)])

    @staticmethod
    def _entry(fqn: str, entry: Any, storage: dict) -> tuple:
        """``(shape, dtype name, [chunks])`` of a tensor entry; ``((), None, [chunk])``
        of a bytes entry (``storage``: ``{(fqn, chunk offsets): _StorageInfo}``)."""

        def chunk(offsets: tuple[int, ...], sizes: tuple[int, ...]) -> _Chunk:
            info = storage.get((fqn, offsets))
            if info is None:
                raise ValueError(f"no storage for {fqn} at {offsets}")
            if getattr(info, "transform_descriptors", None):
                raise ValueError(f"{fqn} is stored transformed "
                                 f"({info.transform_descriptors!r:.40}); not supported")
            start, length = int(info.offset), int(info.length)
            name = info.relative_path
            if start < 0 or length < 0 or not isinstance(name, str) or Path(name).name != name:
                raise ValueError(f"bad storage record for {fqn}")  # (a path out of the folder)
            return _Chunk(offsets, sizes, info.relative_path, start, length)

        if entry.kind == "BytesStorageMetadata":
            return (), None, [chunk((), ())]
        dtype = entry.properties.dtype
        if entry.kind != "TensorStorageMetadata" or not isinstance(dtype, _Dtype):
            raise ValueError(f"entry {fqn} is a {entry.kind}")
        shape = int_tuple(entry.size)
        return shape, dtype.name, [chunk(int_tuple(c.offsets), int_tuple(c.sizes))
                                   for c in entry.chunks]

    def _check_files(self, fqns: list[str]) -> None:
        """Every chunk of every entry in ``fqns`` inside an existing data file."""
        sizes: dict[str, int] = {}
        for fqn in fqns:
            for c in self.entries[fqn][2]:
                if c.file not in sizes:
                    path = self.directory / c.file
                    sizes[c.file] = path.stat().st_size if path.is_file() else -1
                if sizes[c.file] < 0:
                    raise ConfigError(f"{WHAT}: {self.directory / c.file} (listed in .metadata) "
                                      "is missing")
                if c.start + c.length > sizes[c.file]:
                    raise ConfigError(f"{WHAT}: {self.directory / c.file} is truncated: "
                                      f"{sizes[c.file]} bytes, .metadata needs "
                                      f"{c.start + c.length} ({fqn})")

    def _blob(self, c: _Chunk) -> bytes:
        with open(self.directory / c.file, "rb") as f:
            f.seek(c.start)
            return f.read(c.length)

    def entry(self, fqn: str) -> Any:
        """Entry ``fqn`` (``model.*`` or ``optim.*``): a tensor as numpy in its stored
        dtype (bf16 as ``ml_dtypes.bfloat16``, no fp32 copy here), or the Python
        value a bytes entry holds."""
        shape, dtype, chunks = self.entries[fqn]
        self._check_files([fqn])
        path = self.directory / chunks[0].file
        try:
            if dtype is None:
                return read_torch_save(self._blob(chunks[0]))
            out = None
            for c in chunks:
                part = read_torch_save(self._blob(c))
                if not isinstance(part, np.ndarray) or part.shape != c.sizes or str(
                        part.dtype) != str(_dtypes()[dtype]):
                    raise ValueError(f"chunk at {c.offsets} is not a {dtype} tensor of "
                                     f"shape {c.sizes}")
                if len(chunks) == 1 and c.sizes == shape:
                    return part
                if out is None:
                    out = np.zeros(shape, part.dtype)
                box = zip(c.offsets, c.sizes, strict=True)
                out[tuple(slice(o, o + s) for o, s in box)] = part
            if out is None or sum(int(np.prod(c.sizes)) for c in chunks) != out.size:
                raise ValueError("its chunks do not cover the tensor")
            return out
        except Refused as e:
            raise _refused(path, e.what) from None
        except Exception as e:
            raise ConfigError(f"{WHAT}: {path}: entry {fqn} cannot be read, the checkpoint is "
                              f"damaged ({_one_line(e)})") from None

    def read(self, key: str) -> np.ndarray:
        """Model tensor ``key`` (without the ``model.`` prefix)."""
        return self.entry(MODEL_PREFIX + key)


# ------------------------------------------------------------------ written
#
# The reader above needs no torch; writing the
# format does: ``.metadata`` pickles torch's classes, each chunk is a
# ``torch.save`` archive.  Rather than forge either, the export hands the
# tensors to ``torch.distributed.checkpoint.save`` with a ``FileSystemWriter``
# in one process (no process group), which lays the directory out as OLMo-core's
# trainer does: ``.metadata`` and ``__0_0.distcp``, every entry under
# ``model.`` (a nested ``{"model": {...}}`` state dict, flattened by torch's
# planner as OLMo-core's ``save_model_and_optim_state`` flattens its own).


def require_torch(command: str):
    """``torch.distributed.checkpoint``, or the one line saying how to get it."""
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:
        raise ConfigError(f"{command} writes OLMo-core's checkpoint format with torch's own "
                          "writer and needs torch: pip install torch") from None
    return dcp


def _as_torch(x: np.ndarray):
    """A numpy array as a CPU torch tensor of the same dtype and bits (bfloat16,
    which torch.from_numpy does not take, through its 16-bit pattern)."""
    import torch

    x = np.array(x, order="C")  # a C-ordered copy, 0-d kept (ascontiguousarray makes it 1-d)
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def write_model(directory: Path, tensors: dict[str, np.ndarray], command: str) -> None:
    """``directory`` (new) as a distributed checkpoint whose entries are
    ``model.<key>`` for each of ``tensors``.  A write the disk failed raises the
    disk's OSError (a full disk's rule: :mod:`depthbench.faults`)."""
    import os
    import warnings

    from depthbench import faults

    dcp = require_torch(command)
    state = {"model": {key: _as_torch(x) for key, x in tensors.items()}}
    writer = dcp.FileSystemWriter(directory, single_file_per_rank=True, thread_count=1)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.save(state, storage_writer=writer, no_dist=True)
    except (Exception, dcp.CheckpointException) as e:  # the latter is a BaseException
        code = faults.os_error_code(e)
        if code is None:  # torch's zip writer drops the OS's reason ("[enforce fail at
            # inline_container.cc]"): ask the disk for as much as the largest tensor needed
            probe = directory / ".space-probe"
            try:
                with open(probe, "wb") as f:
                    f.write(bytes(min(max(x.nbytes for x in tensors.values()), 1 << 26)))
                    os.fsync(f.fileno())
            except OSError as disk:
                code = disk.errno
            finally:
                probe.unlink(missing_ok=True)
        if code in faults.STORAGE_ERRNOS:
            raise OSError(code, os.strerror(code), str(directory)) from e
        raise
