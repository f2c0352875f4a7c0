"""Each family's mapping to the original's checkpoints holds both ways (OriginalFormat).

On the original's own checkpoints (tests/fixtures/original_checkpoints/): the
tensors a design's import reads come back out of its parameters bit for bit
(``olmo_weights.export``), and the block config a family writes
(``to_original``) reads back as the same fields.  A family's config the
original never trained is refused in one line, and the capability is what
the importer asks: no family name in its code.  Unit tests: no model runs.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import original_outputs as original
import pytest
from paths import SRC

from depthbench.errors import ConfigError
from depthbench.formats.olmo.config import read_config, read_model
from depthbench.formats.olmo.distcp import DistCheckpoint
from depthbench.formats.olmo.step_dir import model_of, param_shapes
from depthbench.formats.olmo.weights import convert, export, ignored
from depthbench.formats.run_writer import run_config
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.original_format import OriginalFormat


def _imported(design: str):
    saved = read_config(original.step_dir(design))
    model = read_model(saved)
    config = run_config("test", model.family, model.model_fields, model.reading.residual, 16,
                        train=model.reading.train)
    family = model_of(config).family
    ckpt = DistCheckpoint(original.step_dir(design) / "model_and_optim")
    present = {k: shape for k, (shape, _) in ckpt.tensors.items()}
    params = convert(ckpt.read, present, family, param_shapes(model_of(config)), block=model.block,
                     tied=model.tied)
    return saved, model, family, ckpt, params


@pytest.mark.parametrize("design", original.DESIGNS)
def test_the_checkpoint_comes_back_out_of_the_import(design):
    _, model, family, ckpt, params = _imported(design)
    out = export(params, family, tied=model.tied)
    wanted = {k for k in ckpt.tensors if not ignored(family, k)}
    assert set(out) == wanted
    for key in sorted(wanted):
        theirs = np.asarray(ckpt.read(key))
        assert out[key].dtype == theirs.dtype and np.array_equal(out[key], theirs), key


@pytest.mark.parametrize("design", original.DESIGNS)
def test_the_block_config_reads_back_as_the_same_fields(design):
    saved, model, family, _, _ = _imported(design)
    if design in original.NOT_STEPPED:  # its width-muP rules are no fields: not exported
        with pytest.raises(ConfigError, match="width-muP"):
            family.to_original()
        return
    block = {**saved["model"]["block"], **family.to_original()}
    # (what the family's blocks need beside the block: MoDA's last-block override)
    again = dict(saved, model={**saved["model"], "block": block, **family.original_model(block)})
    read = read_model(again)
    assert read.family == model.family
    assert read.reading.residual == model.reading.residual
    if read.reading.choice is not None:
        assert read.reading.choice.certain and read.reading.choice.value == "final"


@pytest.mark.parametrize("family,fields,needle", [
    ("hc", {"readout": "norm_then_sum"}, "this hc is mixed/norm_then_sum"),
    ("mhc", {"mhc_sinkhorn": "log"}, "this mhc is neither"),
    ("lns", {"lns_power": 0.25}, "lns_power 0.25"),
    ("moda", {"moda_kv_heads": 2}, "moda_kv_heads 2"),
    ("attnres_block", {"attnres_partition": "count", "attnres_blocks": 5}, "blocks 3x2+2x1"),
])
def test_a_config_the_original_never_trained_is_one_line(family, fields, needle):
    from depthbench.config import apply_overrides, base_config

    c = apply_overrides(base_config(), {"model.family": family, "model.suite": "",
                                        "model.depth": 4, "model.d_model": 48,
                                        "model.n_heads": 3, "model.d_ff": 128,
                                        "model.vocab_size": 128,
                                        **{f"model.residual.{k}": v for k, v in fields.items()}})
    with pytest.raises(ConfigError, match=re.escape(needle)):
        model_of(c).family.to_original()


def test_every_family_the_original_trained_declares_its_format_and_no_other():
    trained = {name for name, cls in registry.FAMILIES.items() if issubclass(cls, OriginalFormat)}
    assert trained == set(registry.names()) - {"mix_ln"}
    blocks = Counter(b for name in trained for b in registry.get(name).original_blocks)
    # one family per block type, but AttnRes's, split by its block size
    assert blocks.pop("attnres") == 2 and set(blocks.values()) == {1}


def test_the_importer_names_no_family():
    """The mapping lives with the families: the importer's code is generic."""
    code = "\n".join(p.read_text() for p in (SRC / "depthbench" / "importers").glob("olmo*.py"))
    for name in registry.names():
        assert not re.search(rf"\b{name}\b", code), name


def test_saved_config_json_round_trips_through_json():
    """What export will write is JSON (the original's config.json)."""
    for design in set(original.DESIGNS) - set(original.NOT_STEPPED):
        _, _, family, _, _ = _imported(design)
        block = family.to_original()
        assert json.loads(json.dumps(block)) == block
