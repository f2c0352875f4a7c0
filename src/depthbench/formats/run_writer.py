"""The run directory an import writes, in the trainer's format.

``config.json`` (the resolved config; ``resolved.<source>`` says where the
weights came from), an Orbax checkpoint at step 0 under ``checkpoints/``
(sealed with its integrity record like every trainer checkpoint) and the
tokenizer files copied along.  The checkpoint holds either a full
:class:`~depthbench.train.state.TrainState` with a fresh optimizer state
(``import-hf``: an imported model can be fine-tuned) or only the parameters
(item ``params``: what ``load_run`` needs, a third of the memory for Adam).

The directory is built aside and renamed into place only once complete
(:func:`depthbench.output_paths.built_aside`, the one output rule).  The
parameters arrive as a nested dict of host (numpy) arrays and are moved to
the devices one leaf at a time, each host copy dropped as soon as its device
copy exists, so the import never holds two copies of the model.

What an import takes from the checkpoint's own config is checked here for
both importers: its ``config.json`` is read within the bounds every JSON
reader keeps (:func:`depthbench.rundir.io.read_json`: a regular file inside
the checkpoint, its size and nesting capped), its shape against the
tensors the checkpoint holds before anything is built from it
(:func:`check_declared`), a training length within :data:`MAX_LENGTH`
tokens (:func:`length`), a special token an id inside the vocabulary
(:func:`token_id`); the tokenizer files are copied by
:func:`depthbench.confine.copy_file` (regular files, at most
:data:`TOKENIZER_LIMIT` bytes each).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from depthbench import confine
from depthbench.config import base_config, validate
from depthbench.errors import ConfigError
from depthbench.output_paths import built_aside
from depthbench.rundir.io import read_json

MAX_LENGTH = 1 << 24  # tokens of a training length an import records (16.8M)
TOKENIZER_LIMIT = 1 << 30  # bytes of one tokenizer file copied by an import or an export


def read_source_config(src: Path, command: str, expected: str) -> dict:
    """``src/config.json`` of the checkpoint being imported, as a dict; ConfigError
    (one line) if it is missing (``expected`` says what ``src`` should be), not
    a regular file of the checkpoint's own, too large, not JSON, or not a JSON
    object."""
    path = confine.member(src, "config.json", f"{command}: config.json")
    try:
        saved = read_json(path)
    except ConfigError as e:  # DamagedFile: "<path>: <what is wrong>"
        raise ConfigError(f"{command}: {e}") from None
    if saved is None:
        raise ConfigError(f"{command}: {path} does not exist (expected {expected})")
    return saved


def check_declared(fields: dict[str, Any], present: dict[str, tuple[int, ...]], *, tied: bool,
                   block: str, embed: str, names: dict[str, str], where: str) -> None:
    """A checkpoint config's shape (``fields``: depth, d_model, d_ff, n_heads,
    n_kv_heads, vocab_size) against the tensors the checkpoint holds
    (``present``: name -> shape), before a model, a tensor list or an array is
    built from it: as many blocks as it says (``block``: the pattern of a
    block's tensor names, its index the group), the embedding (``embed``) of
    ``[vocab_size, d_model]``, and no more backbone parameters than the
    checkpoint holds elements.  ``names``: each field's name in the config;
    ``where``: the line's start."""
    blocks = {int(m.group(1)) for key in present if (m := re.match(block, key))}
    depth, d, vocab = fields["depth"], fields["d_model"], fields["vocab_size"]
    if len(blocks) != depth or (blocks and max(blocks) != depth - 1):
        raise ConfigError(f"{where}: {names['depth']} is {depth:,}; the checkpoint holds "
                          f"{len(blocks)} blocks, numbered up to {max(blocks, default=-1)}")
    shape = present.get(embed)
    if shape != (vocab, d):
        held = "absent" if shape is None else " x ".join(map(str, shape))
        raise ConfigError(f"{where}: {names['vocab_size']} x {names['d_model']} is {vocab:,} x "
                          f"{d:,}; the checkpoint's {embed} is {held}")
    kv_width = fields["n_kv_heads"] * (d // fields["n_heads"])
    implied = depth * (2 * d * d + 2 * d * kv_width + 3 * d * fields["d_ff"]) + vocab * d * (
        1 if tied else 2)
    held = sum(math.prod(shape) for shape in present.values())
    if implied > held:
        raise ConfigError(f"{where}: {names['d_ff']} {fields['d_ff']:,} with its other widths "
                          f"declares {implied:,} backbone parameters; the checkpoint holds "
                          f"{held:,} elements")


def length(value: Any, field: str, default: int) -> int:
    """A training length from a checkpoint's config (``field``: where), ``default``
    when absent: a positive integer up to :data:`MAX_LENGTH`."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_LENGTH:
        raise ConfigError(f"{field} must be an integer from 1 to {MAX_LENGTH:,} (tokens), got "
                          f"{str(value)[:40]}")
    return value


def token_id(value: Any, field: str, vocab_size: int) -> int | None:
    """A special token's id from a checkpoint's config (``field``: where): None
    when absent or negative (none), else an integer below ``vocab_size``."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value < 0):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value >= vocab_size:
        raise ConfigError(f"{field} must be a token id from 0 to {vocab_size - 1} (or null), "
                          f"got {str(value)[:40]}")
    return value


def run_config(name: str, family: str, model_fields: dict[str, Any], residual: dict[str, Any],
               max_len: int, train: dict[str, Any] | None = None):
    """A validated config for an imported model: ``family`` with an explicit
    shape and numerics (``model_fields``: depth, d_model, d_ff, n_heads,
    n_kv_heads, vocab_size, norm_eps, rope_theta), its residual fields, fp32
    weights and compute; ``train``: fields of the train section the source
    trained with (its optimizer rule)."""
    c = base_config()
    c.name = name
    m = c.model
    m.family, m.suite, m.budget = family, "", 0.0
    for key, value in model_fields.items():
        m[key] = value
    for key, value in residual.items():
        m.residual[key] = value
    m.param_dtype = m.compute_dtype = "float32"
    m.remat_policy = "none"
    c.train.seq_len = int(max_len)
    c.train.steps = 1  # nothing was trained here; validation needs > 0 (a fine-tune sets its own)
    for key, value in (train or {}).items():
        c.train[key] = value
    return validate(c)


def tokenizer_info(path: str, vocab_size: int, *, eos: int | None, bos: int | None,
                   pad: int | None, val_tokens: tuple[str, int] = ("", 0)) -> dict:
    """``resolved.tokenizer`` of an imported run (the trainer's field names);
    ``path`` is the tokenizer file in the run ("" when none was copied);
    ``val_tokens``: a validation token file and its length (analyses read it)."""
    return {"corpus": "", "corpus_fingerprint": "", "kind": "hf", "tokenizer_path": path,
            "train_tokens_path": "", "val_tokens_path": val_tokens[0],
            "vocab_size": int(vocab_size),
            "bos_id": -1 if bos is None else int(bos), "eos_id": -1 if eos is None else int(eos),
            "pad_id": -1 if pad is None else int(pad), "train_tokens": 0,
            "val_tokens": int(val_tokens[1]),
            "train_documents": 0, "val_documents": 0, "train_bytes": 0, "val_bytes": 0,
            "bytes_per_token": 0.0, "token_dtype": "uint32"}


def _to_devices(params_np: dict, shardings: Any) -> dict:
    """The nested dict ``params_np`` as device arrays in ``shardings``; each host
    leaf is removed from ``params_np`` as soon as it is placed (it ends empty)."""
    import jax

    out = {}
    for key in list(params_np):
        value = params_np.pop(key)
        if isinstance(value, dict):
            out[key] = _to_devices(value, shardings[key])
        else:
            out[key] = jax.device_put(value, shardings[key])
        del value
    return out


def _save_step0(directory: Path, item: str, tree: Any, meta: dict) -> None:
    """One synchronous Orbax checkpoint at step 0 (item ``item`` and ``meta``),
    sealed with its integrity record."""
    import orbax.checkpoint as ocp

    from depthbench.rundir.integrity import write_integrity
    from depthbench.train.checkpoint import quiet_failed_writes

    quiet_failed_writes()  # a full disk is the one line write_run says, not Orbax's reports
    options = ocp.CheckpointManagerOptions(max_to_keep=1, create=True,
                                           enable_async_checkpointing=False)
    manager = ocp.CheckpointManager(directory, options=options)
    try:
        manager.save(0, args=ocp.args.Composite(**{item: ocp.args.StandardSave(tree),
                                                   "meta": ocp.args.JsonSave(meta)}), force=True)
        manager.wait_until_finished()
    finally:
        manager.close()
    write_integrity(directory / "0")


def write_run(out: Path, config, params_np: dict, *, source: tuple[str, dict],
              files: dict[str, Path], tokenizer: dict[str, Any],
              optimizer_state: bool) -> dict:
    """Write the run directory ``out`` (checked by ``output_paths.check_out``) and
    return the dict written to its ``config.json``.

    ``params_np``: the model's parameter tree as host arrays (consumed: it is
    empty afterwards).  ``source``: ``(key, record)`` stored as
    ``resolved.<key>``.  ``files``: name in the run -> file to copy (the
    tokenizer's).  ``tokenizer``: ``eos``/``bos``/``pad`` ids (None: none).
    ``optimizer_state``: save a full TrainState with a fresh optimizer state
    rather than the parameters alone."""
    import jax
    import numpy as np

    from depthbench import parallel
    from depthbench.rundir.io import atomic_write_json
    from depthbench.rundir.names import CHECKPOINT_DIR, CONFIG_FILE
    from depthbench.train import state as state_lib

    setup = state_lib.setup(config, parallel.mesh_from_config(config))
    want = jax.tree.map(lambda a: tuple(a.shape), setup.abstract_state.params)
    got = jax.tree.map(lambda a: tuple(np.shape(a)), params_np)
    if want != got:  # a programming error in a converter, not bad input
        raise AssertionError(f"converted tree {got} != model tree {want}")
    with built_aside(out, str(config.name)) as work:
        for name, src in files.items():
            confine.copy_file(src, work / name, TOKENIZER_LIMIT, f"{config.name}: {name}")
        params = _to_devices(params_np, setup.param_shardings)
        n_params = state_lib.param_count(params)
        meta = {"train_seconds": 0.0, "timed_tokens": 0, "wall_seconds": 0.0,
                "imported_from": str(source[1].get("source", ""))}
        if optimizer_state:
            with setup.context():
                opt_state = jax.jit(setup.tx.init,
                                    out_shardings=setup.state_shardings.opt_state)(params)
            rng = jax.device_put(state_lib._key_data(int(config.train.seed)),
                                 setup.state_shardings.rng)
            step = jax.device_put(np.int32(0), setup.state_shardings.step)
            tree = state_lib.TrainState(step=step, params=params, opt_state=opt_state, rng=rng)
            _save_step0(work / CHECKPOINT_DIR, "state", tree, meta)
        else:
            _save_step0(work / CHECKPOINT_DIR, "params", params, meta)
        del params
        vocab = int(config.model.vocab_size)
        tokenizer_file = next((str(out / name) for name in ("tokenizer.json", "tokenizer.model")
                               if name in files), "")
        resolved = {"shape": setup.spec.shape.as_dict(), "params": n_params,
                    "tokenizer": tokenizer_info(tokenizer_file, vocab, **tokenizer),
                    "mesh": parallel.describe(setup.mesh),
                    source[0]: {**source[1], "copied": sorted(files)}}
        written = {**config.to_dict(), "resolved": resolved}
        atomic_write_json(work / CONFIG_FILE, written)
    return written
