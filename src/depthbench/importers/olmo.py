"""Import a checkpoint the original DepthBench released as a depthbench run.

A released step directory (``step7600/`` of a hub repository, or a
repository root holding the final checkpoint) has::

    config.json                  the OLMo-core experiment config (model, tokenizer ids)
    model_and_optim/.metadata    torch distributed checkpoint index
    model_and_optim/*.distcp     model.* and optim.* tensors
    ../tokenizer/ or tokenizer/  the Hugging Face tokenizer files

:mod:`olmo_config` reads the model's design and shape, :mod:`distcp` the
tensors (one at a time, without torch or olmo_core, no pickle trusted;
optimizer state never read), :mod:`olmo_weights`
places them, and :mod:`run_writer` writes the run: its parameters only
(item ``params``), fp32 (a leaf the family stores otherwise, as it is),
at step 0; ``resolved.olmo`` records the source, its training step, block
type and every departure from the original that depthbench cannot express.
Nothing is written until everything has been read and checked.
"""

from __future__ import annotations

import re
from pathlib import Path

from depthbench.errors import ConfigError
from depthbench.importers import run_writer
from depthbench.importers.distcp import DistCheckpoint
from depthbench.importers.olmo_config import WHAT, read_config, read_model
from depthbench.importers.olmo_weights import convert

CHECKPOINT_DIR = "model_and_optim"


def family_of(config):
    """The residual family of ``config``'s model (a family instance)."""
    from depthbench.model.residual.protocol import registry
    from depthbench.model.spec import ModelSpec

    return registry.build(ModelSpec.from_config(config))


def _param_shapes(config) -> dict:
    """The model's parameter tree as nested dicts of ``(shape, dtype)`` (no arrays
    made): fp32, except where the family stores a leaf otherwise (Liger mHC's
    ``phi`` in bf16, as the checkpoint holds it)."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    from depthbench.model.spec import ModelSpec
    from depthbench.model.transformer import Transformer

    model = Transformer(ModelSpec.from_config(config))
    boxed = jax.eval_shape(lambda k: model.init(k, jnp.zeros((1, 8), jnp.int32)),
                           jax.random.key(0))["params"]

    def shapes(node):
        return {k: shapes(v) for k, v in node.items()} if isinstance(node, dict) else (
            tuple(node.shape), node.dtype)

    return shapes(nn.unbox(boxed))


def tokenizer_files(step: Path) -> dict[str, Path]:
    """The tokenizer files beside the checkpoint: ``step/tokenizer/`` (a root
    layout) or ``step/../tokenizer/`` (step directories of one run)."""
    for folder in (step / "tokenizer", step.parent / "tokenizer"):
        if folder.is_dir():
            return {name: folder / name for name in run_writer.TOKENIZER_FILES
                    if (folder / name).is_file()}
    return {}


def _seq_len(saved: dict) -> int:
    for section, key in (("dataset", "sequence_length"), ("train_module", "max_sequence_length")):
        value = (saved.get(section) or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


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
    out = run_writer.check_out(out, WHAT)
    saved = read_config(step)
    model = read_model(saved, options)
    val = _val_tokens(val_tokens, model.model_fields["vocab_size"])
    ckpt = DistCheckpoint(step / CHECKPOINT_DIR)
    reading = model.reading
    config = run_writer.run_config(WHAT, model.family, model.model_fields, reading.residual,
                                   _seq_len(saved), train=reading.train)
    present = {key: shape for key, (shape, _) in ckpt.tensors.items()}
    params_np = convert(ckpt.read, present, family_of(config), _param_shapes(config),
                        block=model.block, tied=model.tied, progress=progress)
    tok = ((saved.get("dataset") or {}).get("tokenizer") or {})
    match = re.fullmatch(r"step(\d+)", step.name)
    record = {"source": str(step), "step": int(match.group(1)) if match else None,
              "block": model.block, "dtypes": sorted({dt for _, dt in ckpt.tensors.values()}),
              "original_block": saved["model"].get("block"),
              "departures": list(reading.departures),
              "form": reading.choice.record() if reading.choice else None}
    return run_writer.write_run(
        out, config, params_np, source=("olmo", record), files=tokenizer_files(step),
        tokenizer={"eos": tok.get("eos_token_id"), "bos": tok.get("bos_token_id"),
                   "pad": tok.get("pad_token_id"), "val_tokens": val},
        optimizer_state=False)
