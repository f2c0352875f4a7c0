"""Flat on-disk token arrays: written once by streaming, then memory-mapped.

The writer appends chunks and then rewrites the header with the final length
(numpy reserves room for it), so memory stays flat however large the corpus;
readers check the header against the file size, so a truncated file is one
error naming it rather than a crash mid-training."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from depthbench.errors import ConfigError

_HEADER_LOCK = threading.Lock()  # open_tokens: one .npy header parsed at a time


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype holding ids below ``vocab_size``."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class TokenWriter:
    """Append-only writer of a 1-D ``.npy`` file; the file appears only on ``close()``."""

    def __init__(self, path: str | Path, dtype: np.dtype):
        self.path = Path(path)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.count = 0
        tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._tmp = self.path.with_name(f".{self.path.name}.tmp-{tag}")
        self._file = open(self._tmp, "wb")
        self._write_header()
        self._header_bytes = self._file.tell()

    def _write_header(self) -> None:
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.count,),
        }
        np.lib.format.write_array_header_1_0(self._file, header)

    def write(self, tokens: Iterable[int] | np.ndarray) -> None:
        arr = np.asarray(tokens)
        if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token ids out of range for {self.dtype}")
        self._file.write(arr.astype(self.dtype, copy=False).tobytes())
        self.count += arr.size

    def close(self) -> Path:
        """Finish the header, fsync and rename into place."""
        end = self._file.tell()
        self._file.seek(0)
        self._write_header()  # same length: numpy pads the shape field for growth
        assert self._file.tell() == self._header_bytes, "npy header changed length"
        self._file.seek(end)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def open_tokens(
    path: str | Path, *, field: str = "data.paths", dtype: np.dtype | str | None = None
) -> np.memmap:
    """Memory-map a 1-D token ``.npy``; one ConfigError naming the file if it is unusable.

    ``field`` is the config field the file came from (for the message).
    """
    path = Path(path)
    where = f"config.{field}: {path}"
    if not path.is_file():
        raise ConfigError(f"{where} does not exist")
    size = path.stat().st_size
    try:
        # numpy parses the header with ast.literal_eval, which CPython 3.11 does
        # not make thread-safe: two threads at once can fail with "SystemError:
        # AST constructor recursion depth mismatch".  Readers open in threads.
        with _HEADER_LOCK, open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, descr = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, descr = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError) as e:
        raise ConfigError(f"{where} is not a valid .npy file ({e})") from None
    if descr.hasobject or descr.kind not in "ui":
        raise ConfigError(f"{where} holds {descr}, not integer token ids")
    if dtype is not None and (descr.kind, descr.itemsize) != (
        np.dtype(dtype).kind,
        np.dtype(dtype).itemsize,
    ):
        raise ConfigError(
            f"{where} holds {descr.name}, but data.tokens_dtype is {np.dtype(dtype).name}"
        )
    if len(shape) != 1:
        raise ConfigError(f"{where} has shape {shape}; token shards must be 1-D")
    expected = offset + shape[0] * descr.itemsize
    if size != expected:
        state = "truncated" if size < expected else "longer than its header says"
        raise ConfigError(
            f"{where} is {state}: header says {shape[0]} tokens ({expected} bytes), "
            f"file has {size} bytes"
        )
    if shape[0] == 0:
        return np.zeros((0,), descr)  # mmap cannot map an empty region
    return np.memmap(
        path, dtype=descr, mode="r", offset=offset, shape=shape, order="F" if fortran else "C"
    )
