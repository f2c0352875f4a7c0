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

The index is read by :mod:`~depthbench.formats.olmo.unpickle` with an
allow-list of exactly these classes (``INDEX_CLASSES``), mapped to
stand-ins defined here, each record through its declared, validated fields;
each chunk by :mod:`~depthbench.formats.olmo.torch_save`: torch and
olmo_core are never imported, and a pickle naming anything else
(``os.system``) is one line naming it, with nothing run.  Sharded entries
(FSDP) are assembled from their chunks.  Checkpoints whose chunks are
transformed (compressed) by a newer writer are refused in one line.

Nothing the index declares is believed before it is checked against what
the directory holds, all when it is opened, before any tensor is read:

* **confined**: ``.metadata`` and every data file it names are regular files
  directly inside the directory (:mod:`depthbench.confine`);
* **bounded**: ``.metadata`` is read only up to :data:`INDEX_LIMIT` bytes; a
  chunk's elements times its dtype's size must fit in the bytes its record
  gives it in its file (a ``torch.save`` archive stores its storage
  uncompressed, beside at most :data:`ARCHIVE_SLACK` bytes of zip
  structure), so no tensor declares more than the files hold; a chunk's
  archive yields at most the bytes of its chunk;
* **covered exactly**: the chunks of a tensor lie inside it, overlap
  nowhere and together cover it (each element exactly once: a union of
  boxes, not a sum of their sizes).

:class:`DistCheckpoint` then reads one entry at a time, so memory holds one
tensor beyond what the caller keeps.
"""

from __future__ import annotations

import io
import math
import os
import pickle
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from depthbench import confine
from depthbench.errors import ConfigError
from depthbench.formats.olmo.torch_save import BYTES_LIMIT, Window, dtypes, read_torch_save
from depthbench.formats.olmo.unpickle import (
    Constant,
    Function,
    Refused,
    anything,
    int_tuple,
    loads,
    record,
)

WHAT = "import-olmo"
MODEL_PREFIX = "model."
INDEX = ".metadata"

INDEX_LIMIT = 16 << 20  # bytes of .metadata (a few hundred per chunk: 100,000 chunks)
INDEX_OPS = 4_000_000  # its opcodes (torch's: ~0.4 a byte): a few hundred MB of objects at most
ARCHIVE_SLACK = 64 << 10  # bytes of a chunk's archive beside its storage (torch's: ~1.6 KiB)

_METADATA = "torch.distributed.checkpoint.metadata"


# ------------------------------------------------------------- field validators


def _typed(kind: type | tuple[type, ...], what: str, optional: bool = False):
    def check(value: Any) -> Any:
        if (value is None and optional) or (isinstance(value, kind)
                                            and not isinstance(value, bool)):
            return value
        raise pickle.UnpicklingError(f"{what} is a {type(value).__name__}")
    return check


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise pickle.UnpicklingError(f"a byte count is {str(value)[:40]}")
    return value


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


_STORAGE_INFO = record("_StorageInfo", {
    "relative_path": _typed(str, "a data file name"), "offset": _count, "length": _count,
    "transform_descriptors": anything})
_METADATA_RECORD = record("Metadata", {
    "state_dict_metadata": _typed(dict, "state_dict_metadata"), "planner_data": anything,
    "storage_data": _typed(dict, "storage_data", optional=True), "storage_meta": anything,
    "version": anything})
_TENSOR = record("TensorStorageMetadata", {
    "properties": anything, "size": int_tuple, "chunks": _typed(list, "chunks")})
_CHUNK = record("ChunkStorageMetadata", {"offsets": int_tuple, "sizes": int_tuple})
_BYTES = record("BytesStorageMetadata")
_INDEX_KEY = record("MetadataIndex", {
    "fqn": _typed(str, "an entry name"), "offset": _typed(tuple, "a chunk offset", True),
    "index": anything})
_PROPERTIES = record("TensorProperties", {
    "dtype": _typed(Constant, "a tensor's dtype"), "layout": anything,
    "requires_grad": anything, "memory_format": anything, "pin_memory": anything},
    positional=True)

INDEX_CLASSES: dict[tuple[str, str], Any] = {
    (_METADATA, "Metadata"): _METADATA_RECORD,
    (_METADATA, "TensorStorageMetadata"): _TENSOR,
    (_METADATA, "ChunkStorageMetadata"): _CHUNK,
    (_METADATA, "BytesStorageMetadata"): _BYTES,
    (_METADATA, "MetadataIndex"): _INDEX_KEY,
    (_METADATA, "StorageMeta"): record("StorageMeta", dict.fromkeys(
        ("checkpoint_id", "save_id", "load_id", "modules"), anything)),
    (_METADATA, "TensorProperties"): _PROPERTIES,
    (_METADATA, "_MEM_FORMAT_ENCODING"): Function("_MEM_FORMAT_ENCODING", _memory_format),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _STORAGE_INFO,
    # OLMo-core's writer pickles its own copy of the class (same fields).
    ("olmo_core.distributed.checkpoint.filesystem", "_StorageInfo"): _STORAGE_INFO,
    ("torch", "Size"): Function("torch.Size", int_tuple),
    ("torch.serialization", "_get_layout"): Function("_get_layout", _layout),
    **{("pathlib", name): Function(f"pathlib.{name}", _path) for name in (
        "Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")},
    **{("torch", name): Constant(name) for name in (
        "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
        "uint8", "bool")},
}


# ----------------------------------------------------------------- the index


def _one_line(e: BaseException) -> str:
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


def _refused(path: Path, what: str) -> ConfigError:
    return ConfigError(f"{WHAT}: {path} names {what}, which a torch checkpoint does not "
                       "hold: refused, nothing in it was run")


class _Chunk(NamedTuple):
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    start: int
    length: int


class _Entry(NamedTuple):
    shape: tuple[int, ...]
    dtype: str | None  # None: a bytes entry
    chunks: list[_Chunk]


def _box_overlap(chunks: list[_Chunk]) -> tuple[_Chunk, _Chunk] | None:
    """Two chunks whose boxes share an element, if any (every pair, 256 rows at a time)."""
    boxes = [c for c in chunks if all(c.sizes)]
    n = len(boxes)
    if n < 2:
        return None
    lo = np.array([c.offsets for c in boxes], dtype=np.int64).reshape(n, -1)
    hi = lo + np.array([c.sizes for c in boxes], dtype=np.int64).reshape(n, -1)
    for i in range(0, n, 256):
        meet = np.all(np.maximum(lo[i:i + 256, None], lo[None]) <
                      np.minimum(hi[i:i + 256, None], hi[None]), axis=-1)
        meet &= np.arange(n)[None] > np.arange(i, min(i + 256, n))[:, None]  # each pair once
        rows, cols = np.nonzero(meet)
        if len(rows):
            return boxes[i + rows[0]], boxes[cols[0]]
    return None


def cover_problem(shape: tuple[int, ...], chunks: list[_Chunk]) -> str | None:
    """Why ``chunks`` do not cover a tensor of ``shape`` exactly once (None: they do):
    each inside it, no two sharing an element, their sizes adding up to it."""
    for c in chunks:
        if len(c.offsets) != len(shape) or len(c.sizes) != len(shape):
            return (f"the chunk at {c.offsets} has {len(c.sizes)} dimensions, the tensor "
                    f"{len(shape)}")
        if any(o + s > n for o, s, n in zip(c.offsets, c.sizes, shape, strict=True)):
            return f"the chunk at {c.offsets} of {c.sizes} reaches past its shape {shape}"
    pair = _box_overlap(chunks)
    if pair is not None:
        return f"its chunks at {pair[0].offsets} and {pair[1].offsets} overlap"
    covered = sum(math.prod(c.sizes) for c in chunks)
    if covered != math.prod(shape):
        return f"its chunks cover {covered:,} of its {math.prod(shape):,} elements"
    return None


class DistCheckpoint:
    """The entries of the distributed checkpoint in ``directory`` (module
    docstring: everything the index declares is checked when it is opened)."""

    def __init__(self, directory: Path):
        self.directory = directory
        meta_path = confine.regular_file(directory, INDEX, f"{WHAT}: {INDEX}")
        if meta_path is None:
            raise ConfigError(f"{WHAT}: {directory / INDEX} does not exist (expected a torch "
                              "distributed checkpoint: .metadata and *.distcp)")
        raw = confine.read_bytes(meta_path, INDEX_LIMIT, f"{WHAT}: {INDEX}")
        try:
            index = loads(raw, INDEX_CLASSES, max_ops=INDEX_OPS)
            del raw
            if not isinstance(index, _METADATA_RECORD):
                raise ValueError(f"the index is a {type(index).__name__}, not a Metadata")
            storage = {}
            for key, info in (index.storage_data or {}).items():
                if not isinstance(key, _INDEX_KEY) or not isinstance(info, _STORAGE_INFO):
                    raise ValueError("storage_data is not MetadataIndex -> _StorageInfo")
                storage[(key.fqn, key.offset or ())] = info
            known = dtypes()
            self.entries = {}
            for fqn, entry in (index.state_dict_metadata or {}).items():
                if not isinstance(fqn, str):
                    raise ValueError("an entry name is not text")
                self.entries[fqn] = self._entry(fqn, entry, storage, known)
        except Refused as e:
            raise _refused(meta_path, e.what) from None
        except Exception as e:  # any other failure of an untrusted index means damaged
            raise ConfigError(f"{WHAT}: {meta_path} is damaged or not a torch checkpoint index "
                              f"({_one_line(e)})") from None
        # model tensors without the prefix: (shape, dtype name)
        self.tensors: dict[str, tuple[tuple[int, ...], str]] = {
            fqn[len(MODEL_PREFIX):]: (entry.shape, entry.dtype)
            for fqn, entry in self.entries.items()
            if fqn.startswith(MODEL_PREFIX) and entry.dtype is not None}
        if not self.tensors:
            raise ConfigError(f"{WHAT}: {meta_path} lists no model.* tensors")
        self._sizes: dict[str, int] = {}
        self._check_files([fqn for fqn in self.entries if fqn.startswith(MODEL_PREFIX)])

    @staticmethod
    def _entry(fqn: str, entry: Any, storage: dict, known: dict[str, np.dtype]) -> _Entry:
        """An entry of the index, its chunks' geometry and byte counts checked
        (``storage``: ``{(fqn, chunk offsets): _StorageInfo}``)."""

        def chunk(offsets: tuple[int, ...], sizes: tuple[int, ...], nbytes: int | None
                  ) -> _Chunk:
            """``nbytes``: the data the chunk holds (None: a bytes entry's, up to
            BYTES_LIMIT)."""
            info = storage.get((fqn, offsets))
            if info is None:
                raise ValueError(f"no storage for {fqn} at {offsets}")
            if info.transform_descriptors:
                raise ValueError(f"{fqn} is stored transformed "
                                 f"({info.transform_descriptors!r:.40}); not supported")
            name, start, length = info.relative_path, info.offset, info.length
            if name is None or start is None or length is None or os.path.basename(
                    name) != name or name in ("", ".", ".."):
                raise ValueError(f"bad storage record for {fqn}")  # (a path out of the folder)
            if nbytes is None and length > BYTES_LIMIT + ARCHIVE_SLACK:
                raise ValueError(f"{fqn} is a record of {length:,} bytes (at most "
                                 f"{BYTES_LIMIT:,} are read)")
            if nbytes is not None and not nbytes <= length <= nbytes + ARCHIVE_SLACK:
                raise ValueError(f"{fqn}'s chunk at {offsets} declares {nbytes:,} bytes of "
                                 f"data in a record of {length:,}")
            return _Chunk(offsets, sizes, name, start, length)

        if isinstance(entry, _BYTES):
            return _Entry((), None, [chunk((), (), None)])
        if not isinstance(entry, _TENSOR) or not isinstance(entry.properties, _PROPERTIES) or (
                entry.properties.dtype is None or entry.size is None or entry.chunks is None):
            raise ValueError(f"entry {fqn} is not a TensorStorageMetadata with a dtype, a size "
                             "and chunks")
        dtype = entry.properties.dtype.name
        if dtype not in known:
            raise ValueError(f"entry {fqn} has dtype {dtype}")
        shape = entry.size
        chunks = []
        for c in entry.chunks:
            if not isinstance(c, _CHUNK) or c.offsets is None or c.sizes is None:
                raise ValueError(f"a chunk of {fqn} is not a ChunkStorageMetadata")
            chunks.append(chunk(c.offsets, c.sizes, math.prod(c.sizes) * known[dtype].itemsize))
        why = cover_problem(shape, chunks)
        if why is not None:
            raise ValueError(f"entry {fqn} of shape {shape}: {why}")
        return _Entry(shape, dtype, chunks)

    def _check_files(self, fqns: list[str]) -> None:
        """Every chunk of every entry in ``fqns`` inside an existing data file,
        a regular file in the checkpoint's directory."""
        for fqn in fqns:
            for c in self.entries[fqn].chunks:
                if c.file not in self._sizes:
                    path = confine.regular_file(self.directory, c.file,
                                                f"{WHAT}: {INDEX}: a data file")
                    self._sizes[c.file] = -1 if path is None else path.stat().st_size
                if self._sizes[c.file] < 0:
                    raise ConfigError(f"{WHAT}: {self.directory / c.file} (listed in .metadata) "
                                      "is missing")
                if c.start + c.length > self._sizes[c.file]:
                    raise ConfigError(f"{WHAT}: {self.directory / c.file} is truncated: "
                                      f"{self._sizes[c.file]} bytes, .metadata needs "
                                      f"{c.start + c.length} ({fqn})")

    def _read_chunk(self, c: _Chunk, storage_limit: int) -> Any:
        path = self.directory / c.file
        with confine.open_regular(path, f"{WHAT}: {INDEX}: a data file") as f:
            return read_torch_save(io.BufferedReader(Window(f, c.start, c.length)),
                                   storage_limit)

    def entry(self, fqn: str) -> Any:
        """Entry ``fqn`` (``model.*`` or ``optim.*``): a tensor as numpy in its stored
        dtype (bf16 as ``ml_dtypes.bfloat16``, no fp32 copy here), or the Python
        value a bytes entry holds."""
        shape, dtype, chunks = self.entries[fqn]
        self._check_files([fqn])
        path = self.directory / chunks[0].file
        try:
            if dtype is None:
                return self._read_chunk(chunks[0], BYTES_LIMIT)
            want = dtypes()[dtype]
            out = None
            for c in chunks:
                part = self._read_chunk(c, math.prod(c.sizes) * want.itemsize)
                if not isinstance(part, np.ndarray) or part.shape != c.sizes or str(
                        part.dtype) != str(want):
                    raise ValueError(f"chunk at {c.offsets} is not a {dtype} tensor of "
                                     f"shape {c.sizes}")
                if len(chunks) == 1:
                    return part
                if out is None:  # its chunks cover it exactly (checked when opened)
                    out = np.empty(shape, part.dtype)
                out[tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes, strict=True))] = part
            return np.zeros(shape, want) if out is None else out
        except Refused as e:
            raise _refused(path, e.what) from None
        except ConfigError:
            raise
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
