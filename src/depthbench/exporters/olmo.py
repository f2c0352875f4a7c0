"""Export a run as a checkpoint in the original DepthBench's release format.

The inverse of :mod:`depthbench.importers.olmo`.  ``STEP_DIR`` gets::

    config.json                  the OLMo-core experiment config (exporters.olmo_config)
    model_and_optim/.metadata    torch distributed checkpoint index
    model_and_optim/__0_0.distcp the model.* tensors (no optimizer state)
    tokenizer/                   the run's tokenizer files, where import-olmo looks

for a run of any family the original trained (the family's ``OriginalFormat``
maps its parameters to the original's tensors, :func:`olmo_weights.export`,
and its fields to a block config, ``to_original``).  Refused in one line,
before anything is read or written: a family the original never trained, a
configuration of one it has no block for, and a block config that would read
back as another model (:func:`~depthbench.exporters.olmo_config.check_reads_back`).
The tensors are written in the dtypes the run stores them in (fp32; Liger
mHC's ``phi`` in bf16), by torch's own writer (:mod:`.distcp_writer`).
"""

from __future__ import annotations

from pathlib import Path

from depthbench.errors import ConfigError
from depthbench.exporters.distcp_writer import require_torch, write_model
from depthbench.exporters.olmo_config import check_reads_back, experiment_config
from depthbench.exporters.source_run import open_run
from depthbench.importers import run_writer
from depthbench.importers.olmo import CHECKPOINT_DIR
from depthbench.importers.olmo_config import original_families
from depthbench.importers.olmo_weights import export
from depthbench.model.residual.protocol.original_format import OriginalFormat

WHAT = "export-olmo"


def _original_family(source):
    family = source.family
    if not isinstance(family, OriginalFormat):
        names = ", ".join(cls.name for cls in original_families())
        raise ConfigError(f"{WHAT}: {source.config.model.family} is not a design the original "
                          f"DepthBench trained, so its format has no block for it; exportable "
                          f"families: {names}")
    return family


def step_config(config, resolved: dict, family) -> dict:
    """config.json of a step directory holding the model of ``config`` (``family``:
    its instance), checked to read back as that model."""
    try:
        saved = experiment_config(config, resolved, family)
    except ConfigError as e:  # the family's line says what the original lacks
        raise ConfigError(f"{WHAT}: {e}") from None
    check_reads_back(saved, config, family, WHAT)
    return saved


def step_tensors(params: dict, family) -> dict:
    """``{checkpoint key (no "model."): array}`` of ``params`` (host arrays): the
    family's tensors and the buffers its original modules keep."""
    tensors = export(params, family)
    for i in range(family.spec.depth):
        tensors.update({f"blocks.{i}.{k}": x for k, x in family.original_buffers(i).items()})
    return tensors


def write_step_dir(directory: Path, saved: dict, tensors: dict,
                   files: dict[str, Path] | None = None) -> None:
    """``directory`` (new): config.json, model_and_optim/, tokenizer/ (``files``)."""
    from depthbench.rundir.io import atomic_write_json

    write_model(directory / CHECKPOINT_DIR, tensors, WHAT)
    atomic_write_json(directory / "config.json", saved)
    if files:
        (directory / "tokenizer").mkdir()
        for name, src in files.items():
            (directory / "tokenizer" / name).write_bytes(src.read_bytes())


def export_olmo(run_dir: str | Path, out: str | Path, *, progress: bool = True) -> dict:
    """Write ``run_dir``'s newest intact checkpoint to the step directory ``out``;
    return what was written (``family``, ``block``, ``step``, ``tensors``, ``copied``)."""
    out = run_writer.check_out(out, WHAT)
    source = open_run(run_dir, WHAT)
    family = _original_family(source)
    saved = step_config(source.config, source.resolved, family)
    require_torch(WHAT)
    tensors = step_tensors(source.params(), family)
    files = source.tokenizer_files()
    if progress:
        print(f"{WHAT}: writing {len(tensors)} tensors to {out}", flush=True)
    with run_writer.built_aside(out, WHAT, "exporting") as work:
        write_step_dir(work, saved, tensors, files)
    return {"family": source.config.model.family, "block": saved["model"]["block"]["name"],
            "step": source.loaded.step, "tensors": len(tensors), "copied": sorted(files)}
