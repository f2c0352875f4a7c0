"""A ``torch.save`` archive, read without torch and trusting nothing.

``torch.save`` writes a zip: ``<name>/data.pkl``, a pickle naming
``torch._utils._rebuild_tensor_v2`` and a storage class, ``<name>/byteorder``
and ``<name>/data/<key>``, each storage's raw bytes, stored uncompressed.
:func:`read_torch_save` reads one (a chunk of a distributed checkpoint,
:mod:`~depthbench.formats.olmo.distcp`) as numpy: the pickle through
:mod:`~depthbench.formats.olmo.unpickle` with the allow-list
:data:`TENSOR_CLASSES`, a tensor rebuilt as a view whose every element lies
inside its storage.  What the archive declares is bounded before it is
read: at most :data:`ZIP_MEMBERS` members (its directory checked before it
is parsed), ``data.pkl`` at most :data:`PICKLE_LIMIT` bytes, its storages
together at most what the caller says the archive must yield, and no
member compressed (a zip bomb declares less than it inflates to).
"""

from __future__ import annotations

import io
import pickle
import zipfile
from typing import Any, BinaryIO

import numpy as np

from depthbench.formats.olmo.unpickle import Constant, Frozen, Function, int_tuple, loads

PICKLE_LIMIT = 1 << 20  # bytes of an archive's data.pkl (a tensor's: ~300)
BYTES_LIMIT = 16 << 20  # bytes of a non-tensor entry (the optimizer's param_groups)
ZIP_MEMBERS = 64  # members of one archive (torch writes 7)


def dtypes() -> dict[str, np.dtype]:
    """torch's dtype names (``torch.float32``: ``"float32"``) as numpy dtypes."""
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


class _Storage(Frozen):
    __slots__ = ("data",)

    def __init__(self, data: np.ndarray):  # 1-D, the storage's dtype
        super().__init__(data=data)


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
    ("torch._utils", "_rebuild_tensor_v2"): Function("_rebuild_tensor_v2", _rebuild_tensor),
    ("collections", "OrderedDict"): Function("OrderedDict", dict),  # the (empty) backward hooks
    **{("torch", name): Constant(dtype) for name, dtype in _STORAGES.items()},
}


def _member(archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
    """Member ``name`` of ``archive``, refused before it is read if it declares more
    than ``limit`` bytes or is compressed (the zip reader stops at the size a
    stored member declares)."""
    info = archive.getinfo(name)
    if info.file_size > limit:
        raise pickle.UnpicklingError(f"{name} inflates to {info.file_size:,} bytes; at most "
                                     f"{limit:,} expected")
    if info.compress_type != zipfile.ZIP_STORED:  # what it inflates to is known only once done
        raise pickle.UnpicklingError(f"{name} is compressed (zip method {info.compress_type}); "
                                     "torch.save stores its members")
    return archive.read(info)


def _open_archive(source: BinaryIO) -> zipfile.ZipFile:
    """The zip in ``source``, its central directory bounded before it is parsed."""
    end = zipfile._EndRecData(source)  # (the stdlib's own end-record reader, zip64 included)
    if end is None:
        raise pickle.UnpicklingError("not a torch.save archive (no zip directory)")
    if end[zipfile._ECD_ENTRIES_TOTAL] > ZIP_MEMBERS or end[zipfile._ECD_SIZE] > (
            ZIP_MEMBERS * 1024):
        raise pickle.UnpicklingError(f"an archive of {end[zipfile._ECD_ENTRIES_TOTAL]:,} "
                                     f"members; at most {ZIP_MEMBERS} are read")
    return zipfile.ZipFile(source)


def read_torch_save(source: bytes | BinaryIO, storage_limit: int = BYTES_LIMIT) -> Any:
    """The object in a ``torch.save`` archive (a zip), without torch: a tensor as a
    numpy array, or plain Python data (the optimizer's ``param_groups``).  Its
    storages together inflate to at most ``storage_limit`` bytes."""
    known = dtypes()
    if isinstance(source, (bytes, bytearray)):
        source = io.BytesIO(source)
    with _open_archive(source) as archive:
        names = archive.namelist()
        pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if pkl is None:
            raise pickle.UnpicklingError("no data.pkl in the archive")
        prefix = pkl[: -len("data.pkl")]
        order = (_member(archive, prefix + "byteorder", 16).decode(errors="replace")
                 if prefix + "byteorder" in names else "little")
        if order not in ("little", "big"):
            raise pickle.UnpicklingError(f"byte order {order[:20]!r}")
        storages: dict[str, _Storage] = {}
        left = [storage_limit]

        def storage(pid: Any) -> _Storage:
            if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                    and isinstance(pid[1], Constant) and isinstance(pid[2], str)):
                raise pickle.UnpicklingError(f"persistent id {str(pid)[:60]}")
            if pid[2] not in storages:  # a storage named twice is read once
                dtype = known[pid[1].name].newbyteorder("<" if order == "little" else ">")
                raw = _member(archive, f"{prefix}data/{pid[2]}", left[0])
                left[0] -= len(raw)
                if len(raw) % dtype.itemsize:
                    raise pickle.UnpicklingError("a storage's size is not a whole number of "
                                                 "items")
                storages[pid[2]] = _Storage(np.frombuffer(raw, dtype).astype(
                    dtype.newbyteorder("="), copy=False))
            return storages[pid[2]]

        return loads(_member(archive, pkl, PICKLE_LIMIT), TENSOR_CLASSES,
                     persistent_load=storage)


class Window(io.RawIOBase):
    """Bytes ``[start, start + length)`` of an open file, as a file of their own."""

    def __init__(self, f: BinaryIO, start: int, length: int):
        self._f, self._start, self._length, self._pos = f, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = min(max(base + offset, 0), self._length)
        return self._pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._length - self._pos)
        if n <= 0:
            return 0
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(memoryview(buffer)[:n])
        self._pos += got or 0
        return got or 0
