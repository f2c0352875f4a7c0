"""export-olmo writes the original's own checkpoints back, through the real file format.

Each of the original's checkpoints (tests/fixtures/original_checkpoints/) is
imported in-process, written as a step directory by the exporter (its
config.json, and model_and_optim/ by torch's own distributed-checkpoint
writer) and read back by the importer: the written checkpoint holds the
original's model tensors bit for bit, and its config.json reads back as the
same family, fields, shape and numerics, so the import of the export is the
same model with the same parameters (the same logits: the integration test
computes them through the commands).  Needs torch (the writer).
"""

from __future__ import annotations

import json

import numpy as np
import original_outputs as original
import pytest

pytest.importorskip("torch", reason="export-olmo writes with torch's own writer")

from depthbench.errors import ConfigError  # noqa: E402
from depthbench.formats.olmo.config import read_config, read_model  # noqa: E402
from depthbench.formats.olmo.distcp import DistCheckpoint  # noqa: E402
from depthbench.formats.olmo.step_dir import (  # noqa: E402
    model_of,
    param_shapes,
    step_config,
    step_tensors,
    write_step_dir,
)
from depthbench.formats.olmo.weights import convert, ignored  # noqa: E402
from depthbench.formats.run_writer import run_config  # noqa: E402


def _import(step_dir):
    """(config, family, params, checkpoint) of the step directory, as import-olmo reads it."""
    model = read_model(read_config(step_dir))
    config = run_config("test", model.family, model.model_fields, model.reading.residual, 16,
                        train=model.reading.train)
    ckpt = DistCheckpoint(step_dir / "model_and_optim")
    present = {k: shape for k, (shape, _) in ckpt.tensors.items()}
    transformer = model_of(config)
    params = convert(ckpt.read, present, transformer.family, param_shapes(transformer),
                     block=model.block, tied=model.tied)
    return config, transformer.family, params, ckpt


@pytest.mark.parametrize("design", [d for d in original.DESIGNS if d not in original.NOT_STEPPED])
def test_the_export_of_an_original_checkpoint_is_that_checkpoint(tmp_path, design):
    config, family, params, theirs = _import(original.step_dir(design))
    tok = {"eos_id": 127, "pad_id": 1, "bos_id": -1}
    write_step_dir(tmp_path, step_config(config, {"tokenizer": tok}, family),
                   step_tensors(params, family))
    assert sorted(p.name for p in (tmp_path / "model_and_optim").iterdir()) == [
        ".metadata", "__0_0.distcp"]
    config2, family2, params2, ours = _import(tmp_path)
    assert family2.name == family.name and family2.cfg == family.cfg
    assert {k: config2.model[k] for k in ("depth", "d_model", "d_ff", "n_heads", "n_kv_heads",
                                          "vocab_size", "norm_eps", "rope_theta")} == {
        k: config.model[k] for k in ("depth", "d_model", "d_ff", "n_heads", "n_kv_heads",
                                     "vocab_size", "norm_eps", "rope_theta")}
    for key, (shape, dtype) in theirs.tensors.items():
        if not ignored(family, key):  # (HC's branch aliases: the same tensors again)
            assert ours.tensors[key] == (shape, dtype), key
            assert np.array_equal(ours.read(key), theirs.read(key)), key
    for a, b in zip(_leaves(params), _leaves(params2), strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["dataset"]["tokenizer"]["eos_token_id"] == 127
    assert saved["dataset"]["tokenizer"]["bos_token_id"] is None


def _leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def test_a_block_config_that_reads_back_as_another_model_is_refused(monkeypatch):
    """The exporter reads what it wrote: a family whose block config loses a field
    is one line, not a checkpoint of another model."""
    config, family, _, _ = _import(original.step_dir("lns"))
    monkeypatch.setattr(type(family), "to_original", lambda self: {"name": "default"})
    with pytest.raises(ConfigError, match=r"^export-olmo: the block config written reads back "
                                          r"as pre_ln, not lns$"):
        step_config(config, {}, family)


def test_the_depth_width_head_factor_is_refused():
    config, family, _, _ = _import(original.step_dir("completep_width"))
    with pytest.raises(ConfigError, match=r"^export-olmo: the original trained depth-muP"):
        step_config(config, {}, family)
