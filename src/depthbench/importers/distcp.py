"""A torch distributed checkpoint (``model_and_optim/``), read one tensor at a time.

OLMo-core saves ``model.*`` and ``optim.*`` entries with
``torch.distributed.checkpoint``: ``.metadata`` (a pickled index: every
entry's shape, dtype and the byte ranges of its chunks in the ``*.distcp``
files) and the data files.  :class:`DistCheckpoint` reads the index, checks
that every byte range of every model entry lies inside an existing file (a
truncated or missing ``.distcp`` is found before anything is converted), and
loads model tensors one at a time through ``torch.distributed.checkpoint``
(which reassembles sharded chunks), so memory holds one tensor beyond what
the caller keeps.  Optimizer entries are never read.

torch is the optional extra ``olmo``; without it the import is one line.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from depthbench.errors import ConfigError

WHAT = "import-olmo"
MODEL_PREFIX = "model."


def require_torch():
    """``torch``, or one line naming the extra that provides it."""
    try:
        import torch
        import torch.distributed.checkpoint  # noqa: F401
    except ImportError:
        raise ConfigError(f"{WHAT} reads OLMo-core checkpoints with torch: "
                          "pip install 'depthbench[olmo]'") from None
    return torch


def _one_line(e: BaseException) -> str:
    """``Type: first line`` of an error; for torch's CheckpointException (which
    wraps each rank's failure with its traceback) that of the first failure."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        e = getattr(first, "exc", first)
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


def _reader_class():
    """``FileSystemReader`` that reads the index once and completes its entries:
    indexes written by other torch versions (OLMo-core's writer under torch 2.8)
    pickle ``_StorageInfo`` without ``transform_descriptors``, which torch 2.13's
    reader dereferences."""
    from torch.distributed.checkpoint import FileSystemReader

    class Reader(FileSystemReader):
        _metadata = None

        def read_metadata(self, *args, **kwargs):
            if self._metadata is None:
                metadata = super().read_metadata(*args, **kwargs)
                for info in (metadata.storage_data or {}).values():
                    if not hasattr(info, "transform_descriptors"):
                        object.__setattr__(info, "transform_descriptors", None)
                self._metadata = metadata
            return self._metadata

    return Reader


class DistCheckpoint:
    """The model entries of the distributed checkpoint in ``directory``."""

    def __init__(self, directory: Path):
        torch = require_torch()
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.directory = directory
        meta_path = directory / ".metadata"
        if not meta_path.is_file():
            raise ConfigError(f"{WHAT}: {meta_path} does not exist (expected a torch distributed "
                              "checkpoint: .metadata and *.distcp)")
        try:
            self._reader = _reader_class()(str(directory))
            metadata = self._reader.read_metadata()
            entries = dict(metadata.state_dict_metadata)
            storage = dict(metadata.storage_data or {})
        except Exception as e:  # a pickle of anything: any failure means damaged
            raise ConfigError(f"{WHAT}: {meta_path} is damaged or not a torch checkpoint index "
                              f"({_one_line(e)})") from None
        self.tensors: dict[str, tuple[tuple[int, ...], object]] = {}
        for fqn, entry in entries.items():
            if fqn.startswith(MODEL_PREFIX) and isinstance(entry, TensorStorageMetadata):
                self.tensors[fqn[len(MODEL_PREFIX):]] = (tuple(entry.size),
                                                         entry.properties.dtype)
        if not self.tensors:
            raise ConfigError(f"{WHAT}: {meta_path} lists no model.* tensors")
        self._check_files(storage)
        self._torch = torch

    def _check_files(self, storage: dict) -> None:
        """Every chunk of every model tensor inside an existing data file."""
        sizes: dict[str, int] = {}
        for index, info in storage.items():
            if not getattr(index, "fqn", "").startswith(MODEL_PREFIX):
                continue
            rel = str(info.relative_path)
            if rel not in sizes:
                path = self.directory / rel
                sizes[rel] = path.stat().st_size if path.is_file() else -1
            if sizes[rel] < 0:
                raise ConfigError(f"{WHAT}: {self.directory / rel} (listed in .metadata) is "
                                  "missing")
            end = int(info.offset) + int(info.length)
            if end > sizes[rel]:
                raise ConfigError(f"{WHAT}: {self.directory / rel} is truncated: "
                                  f"{sizes[rel]} bytes, .metadata needs {end} ({index.fqn})")

    def read(self, key: str) -> np.ndarray:
        """Model tensor ``key`` (without the ``model.`` prefix) as numpy in its
        stored dtype (bf16 as ``ml_dtypes.bfloat16``, a view: no fp32 copy here;
        the caller's assignment into its fp32 arrays converts)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        torch = self._torch
        shape, dtype = self.tensors[key]
        target = torch.empty(shape, dtype=dtype)
        state = {MODEL_PREFIX + key: target}
        try:
            with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
                warnings.simplefilter("ignore")
                dcp.load(state, storage_reader=self._reader)
        except (Exception, CheckpointException) as e:  # the latter is a BaseException
            raise ConfigError(f"{WHAT}: {self.directory}: tensor model.{key} cannot be read, "
                              f"the checkpoint is damaged ({_one_line(e)})") from None
        out = state[MODEL_PREFIX + key].detach()
        if out.dtype == torch.bfloat16:
            import ml_dtypes

            return out.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return out.numpy()
