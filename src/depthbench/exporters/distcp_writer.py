"""Tensors written as a torch distributed checkpoint, by torch's own writer.

The reader (:mod:`depthbench.importers.distcp`) needs no torch; writing the
format does: ``.metadata`` pickles torch's classes, each chunk is a
``torch.save`` archive.  Rather than forge either, the export hands the
tensors to ``torch.distributed.checkpoint.save`` with a ``FileSystemWriter``
in one process (no process group), which lays the directory out as OLMo-core's
trainer does: ``.metadata`` and ``__0_0.distcp``, every entry under
``model.`` (a nested ``{"model": {...}}`` state dict, flattened by torch's
planner as OLMo-core's ``save_model_and_optim_state`` flattens its own).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from depthbench.errors import ConfigError


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
    ``model.<key>`` for each of ``tensors``."""
    import warnings

    dcp = require_torch(command)
    state = {"model": {key: _as_torch(x) for key, x in tensors.items()}}
    writer = dcp.FileSystemWriter(directory, single_file_per_rank=True, thread_count=1)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(state, storage_writer=writer, no_dist=True)
