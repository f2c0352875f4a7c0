"""import-olmo's reading of the original's config.json (no torch needed): every
block type the original trained maps to its depthbench family and fields, the
legacy layouts (HC and AttnRes on a default block) too, and what depthbench
cannot map is one ConfigError line naming it.  Unit tests."""

from __future__ import annotations

import copy

import pytest

from depthbench.errors import ConfigError
from depthbench.formats.olmo.config import read_model

NORM = {"name": "rms", "eps": 1e-06, "bias": False, "dtype": "bfloat16"}
MODEL = {  # TransformerConfig.llama_like(...).as_config_dict() of a 400M-L24-like shape
    "d_model": 64, "vocab_size": 97, "n_layers": 4, "name": "default", "dtype": "bfloat16",
    "block": {
        "sequence_mixer": {"name": "default", "n_heads": 4, "n_kv_heads": 4, "bias": False,
                           "rope": {"name": "default", "theta": 10000, "full_precision": True}},
        "feed_forward": {"hidden_size": 160, "name": "default", "bias": False,
                         "activation": "silu"},
        "layer_norm": NORM, "name": "default"},
    "lm_head": {"name": "default", "layer_norm": NORM, "bias": False},
}


def model(**block):
    m = copy.deepcopy(MODEL)
    m["block"].update(block)
    return {"model": m, "train_module": {"optim": {"eps": 1e-8}}}


CASES = [
    (model(), "pre_ln", {}),
    (model(name="peri_norm"), "sandwich_ln", {}),
    (model(name="default_scaled"), "lns", {"lns_power": 0.5}),
    (model(name="deepnorm", layer_norm={**NORM, "name": "default"}), "deepnorm", {}),
    (model(name="keel"), "keel", {}),
    (model(name="post_norm"), "post_ln", {}),
    (model(name="completep", residual_scaling_base_depth=24), "completep",
     {"completep_alpha": 1.0, "completep_base_depth": 24}),
    (model(name="depth_mup", residual_scaling_base_depth=24), "completep",
     {"completep_alpha": 0.5, "completep_base_depth": 24}),
    # hc at config.py@8cc2fd74 and later (MoDA's merge saved moda_skip_ffn_kv): final form
    (model(name="hc", moda_skip_ffn_kv=False,
           hyper_connections={"kind": "hc", "num_residual_streams": 4, "collapse": "auto"}),
     "hc", {"hc_n": 4, "hc_tanh": True, "readout": "sum_then_norm", "hc_write": "mixed"}),
    # early: a default block carrying HC (config.py before 5152cab)
    (model(hyper_connections={"kind": "hc", "num_residual_streams": 4, "tanh": True}), "hc",
     {"hc_n": 4, "hc_tanh": True, "hc_write": "residual", "readout": "norm_then_sum"}),
    # 5152cab: an hc block whose config saved tanh (a bool then): early, by inference
    (model(name="hc", hyper_connections={"kind": "hc", "tanh": True, "collapse": "auto"}),
     "hc", {"hc_write": "residual", "readout": "norm_then_sum"}),
    # the same fields at 5152cab and 2a9d668..8cc2fd74: the final form, chosen
    (model(name="hc", hyper_connections={"kind": "hc", "collapse": "auto"}), "hc",
     {"hc_write": "mixed", "readout": "sum_then_norm"}),
    (model(name="mhc", moda_skip_ffn_kv=False,
           hyper_connections={"kind": "mhc", "tanh": False, "sinkhorn_iters": 20,
                              "sinkhorn_tau": 1.0, "collapse": "auto"}), "mhc",
     {"hc_n": 4, "sinkhorn_iters": 20, "readout": "sum_then_norm", "mhc_sinkhorn": "log",
      "mhc_res_layout": "in_out", "mhc_rms_eps": 1e-8, "mhc_gate_decay": True,
      "mhc_tanh": False}),
    (model(name="mhc", hyper_connections={"kind": "mhc", "tanh": True}), "mhc",
     {"mhc_tanh": True, "readout": "norm_then_sum"}),  # the first mHC checkpoints
    (model(name="mhc", hyper_connections={"kind": "liger_mhc", "collapse": "auto"}), "mhc",
     {"readout": "mean_then_norm", "sinkhorn_temperature": 1.0, "mhc_sinkhorn": "linear",
      "mhc_sinkhorn_eps": 1e-6, "mhc_rms_eps": 1e-6, "mhc_res_layout": "out_in",
      "mhc_gate_decay": False, "mhc_phi_dtype": "bfloat16"}),
    (model(name="attnres", attnres_block_size=1), "attnres_full", {"attnres_eps": 1e-5}),
    (model(attnres_block_size=1), "attnres_full", {}),  # early: AttnRes on a default block
    (model(name="attnres", attnres_block_size=6), "attnres_block",
     {"attnres_block_size": 6, "attnres_partition": "size", "attnres_eps": 1e-5}),
    (model(name="moda", moda={"extra_ffn_kv_proj": True, "extra_attn_kv_proj": False}), "moda",
     {"moda_kv_heads": 0, "moda_norm": "pre", "moda_depth_query": "rotated"}),
    (model(name="post_norm_moda", moda={}), "moda", {"moda_norm": "post"}),
]


@pytest.mark.parametrize("saved,family,fields", CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_every_trained_design_maps(saved, family, fields):
    m = read_model(saved)
    assert m.family == family
    assert {k: m.reading.residual[k] for k in fields} == fields
    assert m.model_fields == {"depth": 4, "d_model": 64, "d_ff": 160, "n_heads": 4,
                              "n_kv_heads": 4, "vocab_size": 97, "norm_eps": 1e-6,
                              "rope_theta": 10000.0}


def test_every_choice_is_a_field_no_departures():
    """What earlier versions recorded as departures (the early HC write rule,
    Liger mHC, AttnRes's eps) are fields now; the imported fields validate."""
    from depthbench.model.residual.protocol import registry

    for saved, family, _ in CASES:
        m = read_model(saved)
        assert m.reading.departures == (), family
        registry.family_config(m.family, m.reading.residual)  # every field known and typed


@pytest.mark.parametrize("block,form,certain", [
    (model(hyper_connections={"kind": "mhc", "tanh": True}), "early", True),  # default block
    (model(name="mhc", moda_skip_ffn_kv=False, hyper_connections={"kind": "mhc"}), "final",
     True),
    (model(name="hc", hyper_connections={"kind": "hc", "tanh": True}), "early", False),
    (model(name="mhc", hyper_connections={"kind": "mhc", "tanh": True}), "early", False),
    (model(name="mhc", hyper_connections={"kind": "mhc", "tanh": False}), "final", False),
    (model(name="hc", hyper_connections={"kind": "hc"}), "final", False),
])
def test_hc_form_from_the_fields_of_each_era(block, form, certain):
    """What config.json says of the HC era (hc_form's docstring), and that an
    undecided case says it chose; --hc-form overrides either way; Liger's mHC has
    one form."""
    m = read_model(block).reading
    assert (m.choice.value, m.choice.certain) == (form, certain)
    other = "early" if form == "final" else "final"
    forced = read_model(block, {"hc_form": other}).reading
    assert forced.choice.value == other and forced.choice.certain
    assert "--hc-form" in forced.choice.why
    readout = {"early": "norm_then_sum", "final": "sum_then_norm"}
    assert (m.residual["readout"], forced.residual["readout"]) == (readout[form], readout[other])
    liger = read_model(model(name="mhc", hyper_connections={"kind": "liger_mhc"}),
                       {"hc_form": "early"}).reading
    assert liger.choice is None and liger.residual["readout"] == "mean_then_norm"


def test_depth_only_completep_trains_with_its_depth_rule():
    """The original's depth-only launcher groups blocks.* with the depth rule's lr
    and eps (pretrain_preln_mup.py@aba1f65): the imported run sets train.lr_rule."""
    m = read_model(model(name="depth_mup", residual_scaling_base_depth=2))
    assert m.reading.train == {"lr_rule": "family"}
    assert read_model(model()).reading.train == {}


def test_depth_width_head_factor_from_the_embedding_eps_override():
    saved = model(name="completep", residual_scaling_base_depth=24)
    saved["train_module"]["optim"]["group_overrides"] = [
        {"params": ["embeddings.weight"], "opts": {"eps": 1e-8 / 0.5}}]  # d / d_base = 0.5
    m = read_model(saved).reading
    assert m.residual["completep_head_scale"] == pytest.approx(2.0)
    assert len(m.departures) == 1 and "width-muP init" in m.departures[0]


REFUSED = [
    (model(name="normalized"), "model.block.name 'normalized' is not a design"),
    (model(name="mhc", hyper_connections={"kind": "mhc_static"}), "'mhc_static' is not one of"),
    (model(name="deepnorm"), "a 'deepnorm' block needs 'default'"),
    (model(name="moda", moda={"extra_ffn_kv_proj": False}), "configure_moda"),
    (model(sequence_mixer={**MODEL["block"]["sequence_mixer"], "qk_norm": {"name": "rms"}}),
     "qk_norm"),
    (model(name="keel", hyper_connections={"kind": "hc"}), "hc's setting on a 'keel' block"),
    (model(name="completep"), "residual_scaling_base_depth must be an integer"),
    (model(feed_forward={"hidden_size": 160, "activation": "gelu"}), "'gelu' is not one of"),
    (model(name="mhc", hyper_connections={"kind": "liger_mhc", "liger_post_mult": 3.0}),
     "liger_post_mult = 3.0 is not supported"),
]


@pytest.mark.parametrize("saved,needle", REFUSED, ids=[r[1][:24] for r in REFUSED])
def test_what_cannot_be_mapped_is_one_line(saved, needle):
    with pytest.raises(ConfigError) as e:
        read_model(saved)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("import-olmo: config.json: ")
