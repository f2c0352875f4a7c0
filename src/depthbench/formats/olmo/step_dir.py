"""A step directory of the original DepthBench, both ways (import-olmo, export-olmo).

A released step directory (``step7600/`` of a hub repository, or a
repository root holding the final checkpoint) has::

    config.json                  the OLMo-core experiment config (model, tokenizer ids)
    model_and_optim/.metadata    torch distributed checkpoint index
    model_and_optim/*.distcp     model.* and optim.* tensors
    ../tokenizer/ or tokenizer/  the Hugging Face tokenizer files

:mod:`.config` reads (and writes) the model's design and shape,
:mod:`.distcp` the tensors (read one at a time, without torch or olmo_core,
no pickle trusted, optimizer state never read; written by torch's own
writer), :mod:`.weights` places them, both ways.

``import-olmo`` writes the run (:mod:`depthbench.formats.run_writer`): its
parameters only (item ``params``), fp32 (a leaf the family stores otherwise,
as it is), at step 0; ``resolved.olmo`` records the source, its training
step, block type and every departure from the original that depthbench
cannot express.  Nothing is written until everything has been read and
checked.

``export-olmo`` writes a run of any family the original trained (the
family's ``OriginalFormat`` maps its parameters to the original's tensors
and its fields to a block config) as ``config.json``,
``model_and_optim/`` (model tensors only, in the dtypes the run stores
them) and ``tokenizer/``.  Refused in one line, before anything is read or
written: a family the original never trained, a configuration of one it has
no block for, and a block config that would read back as another model.
"""

from __future__ import annotations

import re
from pathlib import Path

from depthbench import confine, output_paths
from depthbench.errors import ConfigError
from depthbench.formats import run_writer
from depthbench.formats.olmo.config import (
    WHAT,
    check_reads_back,
    experiment_config,
    original_families,
    read_config,
    read_model,
)
from depthbench.formats.olmo.distcp import DistCheckpoint, require_torch, write_model
from depthbench.formats.olmo.weights import convert, export
from depthbench.model.residual.protocol.original_format import OriginalFormat
from depthbench.rundir.names import TOKENIZER_FILES

CHECKPOINT_DIR = "model_and_optim"
EXPORT = "export-olmo"


def model_of(config):
    """The :class:`~depthbench.model.transformer.Transformer` of ``config`` (its
    ``family`` built once)."""
    from depthbench.model.spec import ModelSpec
    from depthbench.model.transformer import Transformer

    return Transformer(ModelSpec.from_config(config))


def param_shapes(model) -> dict:
    """The model's parameter tree as nested dicts of ``(shape, dtype)`` (no arrays
    made): fp32, except where the family stores a leaf otherwise (Liger mHC's
    ``phi`` in bf16, as the checkpoint holds it)."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    boxed = jax.eval_shape(lambda k: model.init(k, jnp.zeros((1, 8), jnp.int32)),
                           jax.random.key(0))["params"]

    def shapes(node):
        return {k: shapes(v) for k, v in node.items()} if isinstance(node, dict) else (
            tuple(node.shape), node.dtype)

    return shapes(nn.unbox(boxed))


def tokenizer_files(step: Path) -> dict[str, Path]:
    """The tokenizer files beside the checkpoint: ``step/tokenizer/`` (a root
    layout) or ``step/../tokenizer/`` (step directories of one run)."""
    for root, folder in ((step, "tokenizer"), (step.parent, "tokenizer")):
        where = confine.member(root, folder, f"{WHAT}: tokenizer folder")
        if where.is_dir():
            return {name: path for name in TOKENIZER_FILES if (path := confine.regular_file(
                where, name, f"{WHAT}: tokenizer/{name}")) is not None}
    return {}


def _seq_len(saved: dict) -> int:
    """The training length config.json records (2048 when it records none)."""
    for section, key in (("dataset", "sequence_length"), ("train_module", "max_sequence_length")):
        part = saved.get(section)
        value = part.get(key) if isinstance(part, dict) else None
        if value is not None:
            return run_writer.length(value, f"{WHAT}: config.json: {section}.{key}", 2048)
    return 2048


def _token_ids(saved: dict, vocab_size: int) -> dict[str, int | None]:
    """``eos``/``bos``/``pad`` ids of ``dataset.tokenizer`` (each checked)."""
    dataset = saved.get("dataset")
    tok = dataset.get("tokenizer") if isinstance(dataset, dict) else None
    tok = tok if isinstance(tok, dict) else {}
    return {kind: run_writer.token_id(tok.get(f"{kind}_token_id"), f"{WHAT}: config.json: "
                                      f"dataset.tokenizer.{kind}_token_id", vocab_size)
            for kind in ("eos", "bos", "pad")}


def _val_tokens(path: str | None, vocab_size: int) -> tuple[str, int]:
    """``(absolute path, tokens)`` of the ``--val-tokens`` file, checked: a 1-D
    integer .npy of at least two tokens, every id inside the vocabulary."""
    if not path:
        return "", 0
    from depthbench.data.token_cache import open_tokens

    try:
        tokens = open_tokens(Path(path).expanduser(), field="val-tokens")
    except ConfigError as e:  # "config.val-tokens: PATH ...": name the option instead
        raise ConfigError(f"{WHAT}: --{str(e).removeprefix('config.')}") from None
    if len(tokens) < 2:
        raise ConfigError(f"{WHAT}: --val-tokens: {path} holds {len(tokens)} tokens; need "
                          "at least 2")
    top = max(int(tokens[i:i + (1 << 24)].max()) for i in range(0, len(tokens), 1 << 24))
    if top >= vocab_size:
        raise ConfigError(f"{WHAT}: --val-tokens: {path}: token ids reach {top}, beyond the "
                          f"model's vocabulary of {vocab_size} (another tokenizer's tokens?)")
    return str(Path(path).expanduser().resolve()), len(tokens)


def import_olmo(step_dir: str | Path, out: str | Path, *, progress: bool = True,
                val_tokens: str | None = None, **options: str) -> dict:
    """Convert the step directory ``step_dir`` into the run directory ``out``;
    return the config dict written to ``out/config.json``.  ``val_tokens``: a
    token .npy recorded as the run's validation split (what analyses read);
    ``options``: choices a family's reading of its block takes (its
    ``from_original``: a form config.json does not decide)."""
    if "://" in str(step_dir) or not Path(step_dir).expanduser().is_dir():
        raise ConfigError(f"{WHAT}: {str(step_dir)!r} is not a local directory (the hub is never "
                          "contacted; download the step directory first)")
    step = Path(step_dir).expanduser().resolve()
    out = output_paths.check_out(out, WHAT)
    saved = read_config(step)
    model = read_model(saved, options)
    seq_len, ids = _seq_len(saved), _token_ids(saved, model.model_fields["vocab_size"])
    val = _val_tokens(val_tokens, model.model_fields["vocab_size"])
    ckpt = DistCheckpoint(confine.member(step, CHECKPOINT_DIR, f"{WHAT}: {CHECKPOINT_DIR}"))
    present = {key: shape for key, (shape, _) in ckpt.tensors.items()}
    run_writer.check_declared(
        model.model_fields, present, tied=model.tied, block=r"blocks\.(\d{1,9})\.",
        embed="embeddings.weight", where=f"{WHAT}: config.json", names={
            "depth": "model.n_layers", "d_model": "model.d_model",
            "vocab_size": "model.vocab_size", "d_ff": "model.block.feed_forward.hidden_size"})
    reading = model.reading
    config = run_writer.run_config(WHAT, model.family, model.model_fields, reading.residual,
                                   seq_len, train=reading.train)
    transformer = model_of(config)
    params_np = convert(ckpt.read, present, transformer.family, param_shapes(transformer),
                        block=model.block, tied=model.tied, progress=progress)
    match = re.fullmatch(r"step(\d+)", step.name)
    record = {"source": str(step), "step": int(match.group(1)) if match else None,
              "block": model.block, "dtypes": sorted({dt for _, dt in ckpt.tensors.values()}),
              "original_block": saved["model"].get("block"),
              "departures": list(reading.departures),
              "form": reading.choice.record() if reading.choice else None}
    return run_writer.write_run(
        out, config, params_np, source=("olmo", record), files=tokenizer_files(step),
        tokenizer={**ids, "val_tokens": val},
        optimizer_state=False)


# ------------------------------------------------------------------ export


def _original_family(run):
    family = run.family
    if not isinstance(family, OriginalFormat):
        names = ", ".join(cls.name for cls in original_families())
        raise ConfigError(f"{EXPORT}: {run.spec.family} is not a design the original "
                          f"DepthBench trained, so its format has no block for it; exportable "
                          f"families: {names}")
    return family


def step_config(config, resolved: dict, family) -> dict:
    """config.json of a step directory holding ``family``'s model trained with
    ``config``'s train section, checked to read back as that model."""
    try:
        saved = experiment_config(config, resolved, family)
    except ConfigError as e:  # the family's line says what the original lacks
        raise ConfigError(f"{EXPORT}: {e}") from None
    check_reads_back(saved, family, EXPORT)
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

    write_model(directory / CHECKPOINT_DIR, tensors, EXPORT)
    atomic_write_json(directory / "config.json", saved)
    if files:
        (directory / "tokenizer").mkdir()
        for name, src in files.items():
            confine.copy_file(src, directory / "tokenizer" / name, run_writer.TOKENIZER_LIMIT,
                              f"{EXPORT}: {name}")


def export_olmo(run_dir: str | Path, out: str | Path, *, progress: bool = True) -> dict:
    """Write ``run_dir``'s newest intact checkpoint to the step directory ``out``;
    return what was written (``family``, ``block``, ``step``, ``tensors``, ``copied``)."""
    from depthbench.run import open_run

    out = output_paths.check_out(out, EXPORT)
    run = open_run(run_dir, EXPORT)
    family = _original_family(run)
    saved = step_config(run.config, run.resolved, family)
    require_torch(EXPORT)
    files = run.tokenizer_files()
    loaded = run.load()
    tensors = step_tensors(loaded.host_params(), family)
    if progress:
        print(f"{EXPORT}: writing {len(tensors)} tensors to {out}", flush=True)
    with output_paths.built_aside(out, EXPORT, "exporting") as work:
        write_step_dir(work, saved, tensors, files)
    return {"family": run.spec.family, "block": saved["model"]["block"]["name"],
            "step": loaded.step, "tensors": len(tensors), "copied": sorted(files)}
