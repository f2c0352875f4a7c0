"""Spec loading, override parsing and validation: each failure is one ConfigError line
naming the field."""

from pathlib import Path

import pytest
from paths import FIXTURES

from depthbench import config, configs
from depthbench.config import ConfigError


@pytest.fixture(scope="module")
def base():
    return config.base_config()


def test_base_spec_loads_and_validates():
    c = config.load(config.base_spec_path())
    assert c.model.family == "pre_ln" and c.model.suite == "micro"


def test_overrides_parse_to_the_field_type(base):
    c = config.apply_overrides(
        base,
        [
            "model.depth=8",
            "--config.train.lr=5e-4",
            "config.train.steps=2k",
            "model.residual.hc_tanh=false",  # a field of the family named after it
            "model.budget=400M",
            "model.rope_theta=500000",
            "model.suite=''",
            'model.family="hc"',
        ],
    )
    assert c.model.depth == 8 and type(c.model.depth) is int
    assert c.train.lr == 5e-4 and type(c.train.lr) is float
    assert c.train.steps == 2000 and type(c.train.steps) is int
    assert c.model.residual.hc_tanh is False
    assert c.model.budget == 4e8 and type(c.model.budget) is float
    assert c.model.rope_theta == 500000.0 and type(c.model.rope_theta) is float
    assert c.model.suite == "" and c.model.family == "hc"
    assert base.model.depth == 4  # the input config is not modified
    for text, value in (("true", True), ("1", True), ("on", True), ("no", False)):
        hc = config.apply_overrides(base, ["model.family=hc", f"model.residual.hc_tanh={text}"])
        assert hc.model.residual.hc_tanh is value


def test_dict_overrides_keep_types(base):
    c = config.apply_overrides(base, {"model.depth": 6, "train.lr": 1, "model.budget": "1.6B"})
    assert c.model.depth == 6 and c.train.lr == 1.0 and type(c.train.lr) is float
    assert c.model.budget == 1.6e9
    with pytest.raises(ConfigError, match=r"config\.model\.depth: expected int"):
        config.apply_overrides(base, {"model.depth": 1.5})


@pytest.mark.parametrize(
    "override,pattern",
    [
        ("model.depth=1.5", r"--config\.model\.depth: expected an integer, got '1\.5'"),
        ("model.depth=abc", r"--config\.model\.depth: expected an integer"),
        ("train.lr=fast", r"--config\.train\.lr: expected a number, got 'fast'"),
        ("model.residual.hc_tanh=maybe", r"--config\.model\.residual\.hc_tanh: expected true or"),
        ("model.widht=3", r"--config\.model\.widht: unknown field; known fields here: .*depth"),
        ("modle.depth=3", r"--config\.modle\.depth: unknown section 'modle'"),
        ("model.residual=3", r"--config\.model\.residual: is a section"),
        ("model.depth", r"expected --config\.section\.field=value"),
    ],
)
def test_bad_overrides(base, override, pattern):
    with pytest.raises(ConfigError, match=pattern) as e:
        config.apply_overrides(base, ["model.family=hc", override])
    assert "\n" not in str(e.value)


def _load(*overrides):
    return config.load(config.base_spec_path(), overrides)


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        (["model.family=resnet"], r"config\.model\.family: 'resnet' is not one of .*pre_ln"),
        (
            ["model.suite=''", "model.d_model=100", "model.n_heads=16"],
            r"config\.model\.n_heads: 16 heads do not divide d_model 100",
        ),
        (
            ["model.suite=''", "model.budget=1000", "model.depth=64"],
            r"config\.model\.depth: depth 64 cannot meet a total budget",
        ),
        (["model.suite=''", "model.depth=6"], r"config\.model\.budget: must be > 0"),
        (["model.depth=5"], r"config\.model\.depth: suite 'micro' has no depth 5; allowed: 2, 3"),
        (["model.suite=paper-9b"], r"config\.model\.suite: 'paper-9b' is unknown; allowed: "),
        (["model.depth=0"], r"config\.model\.depth: must be a number > 0, got 0"),
        (["model.vocab_size=-5"], r"config\.model\.vocab_size: must be a number > 0"),
        (["train.batch_size=0"], r"config\.train\.batch_size: must be a number > 0"),
        (["train.seq_len=0"], r"config\.train\.seq_len: must be a number > 0"),
        (["train.lr=0"], r"config\.train\.lr: must be a number > 0, got 0\.0"),
        (["train.lr=-1e-3"], r"config\.train\.lr: must be a number > 0"),
        (["model.d_model=-64"], r"config\.model\.d_model: must be a number >= 0"),
        (["train.weight_decay=-0.1"], r"config\.train\.weight_decay: must be a number >= 0"),
        (
            ["train.batch_size=6", "train.microbatches=4"],
            r"config\.train\.microbatches: 4 must divide",
        ),
        (["train.warmup_fraction=1.0"], r"config\.train\.warmup_fraction: must be in \[0, 1\)"),
        (["model.n_kv_heads=3"], r"config\.model\.n_kv_heads: 3 must divide n_heads 4"),
        (["model.fix=both"], r"config\.model\.fix: 'both' is not one of total, backbone"),
        (["parallel.fsdp=0"], r"config\.parallel\.fsdp: must be a positive integer or -1"),
    ],
)
def test_validation_errors_name_the_field(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern) as e:
        _load(*overrides)
    assert "\n" not in str(e.value)


def test_explicit_shape_and_rule_resolve():
    c = _load("model.suite=''", "model.d_model=128", "model.n_heads=4", "model.depth=3")
    assert (c.model.d_model, c.model.n_heads) == (128, 4)
    c = _load("model.suite=", "model.budget=1.2M", "model.depth=4", "model.n_heads=4")
    assert c.model.budget == 1.2e6


def test_missing_spec_file(tmp_path):
    path = tmp_path / "nope.py"
    with pytest.raises(ConfigError, match=r"spec file '.*nope\.py' does not exist"):
        config.load(path)


def test_bundled_specs_resolve_by_name_and_files_by_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # names do not depend on the working directory
    assert {"base", "micro", "quickstart", "micro_all", "paper_400m"} <= set(configs.names())
    by_name = config.load("micro")
    assert by_name.name == "micro" and by_name.model.remat_policy == "matmuls_saveable"
    assert config.load("micro.py").to_dict() == by_name.to_dict()
    assert config.spec_path("quickstart") == Path(configs.__file__).with_name("quickstart.py")
    assert config.import_spec("quickstart").get_sweep()  # a sweep spec keeps get_sweep()
    # A file of the same name in the working directory wins: a path is a path.
    (tmp_path / "micro.py").write_text(
        "from depthbench.configs import micro\n"
        "def get_config():\n"
        "    c = micro.get_config()\n"
        "    c.name = 'mine'\n"
        "    return c\n")
    assert config.load("micro.py").name == "mine" and config.load("micro").name == "micro"
    with pytest.raises(ConfigError, match=r"'quikstart' does not exist, and it names none of "
                                          r"the bundled specs \(base, .*quickstart"):
        config.load("quikstart")


def test_spec_without_get_config(tmp_path):
    path = tmp_path / "empty.py"
    path.write_text("X = 1\n")
    with pytest.raises(ConfigError, match=r"spec file '.*empty\.py' has no get_config\(\)"):
        config.load(path)


def test_spec_that_fails_to_import(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import not_a_module_xyz\n")
    with pytest.raises(ConfigError, match=r"broken\.py' failed to load: .*not_a_module_xyz"):
        config.load(path)


def test_spec_returning_a_dict(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text("def get_config():\n    return {'model': {}}\n")
    with pytest.raises(ConfigError, match=r"must return a ConfigDict"):
        config.load(path)


def test_spec_inherits_from_base_and_unknown_keys_are_caught(tmp_path):
    base_file = config.base_spec_path()
    good = tmp_path / "good.py"
    good.write_text(
        "from depthbench import config\n"
        f"base = config.import_spec({str(base_file)!r})\n"
        "def get_config():\n"
        "    c = base.get_config()\n"
        "    c.model.depth = 6\n"
        "    return c\n"
    )
    assert config.load(good, ["train.steps=7"]).model.depth == 6
    bad = tmp_path / "bad.py"
    bad.write_text(good.read_text().replace("c.model.depth = 6", "c.model.dpeth = 6"))
    with pytest.raises(ConfigError, match=r"config\.model\.dpeth: unknown field"):
        config.load(bad)


def test_parse_count():
    assert config.parse_count("400M") == 4e8
    assert config.parse_count("1.6B") == 1.6e9
    assert config.parse_count("12k") == 12_000
    assert config.parse_count("1e6") == 1e6
    with pytest.raises(ValueError):
        config.parse_count("lots")


# ------------------------------------------------- the family's own fields


def test_residual_holds_only_the_chosen_familys_fields(base):
    assert base.model.family == "pre_ln" and base.model.residual.to_dict() == {}
    hc = config.load("micro", ["model.family=hc"])
    assert hc.model.residual.to_dict() == {"hc_n": 4, "hc_scale_init": 0.01,
                                           "readout": "sum_then_norm", "hc_tanh": True,
                                           "hc_write": "mixed"}
    assert config.load("micro", ["model.family=lns"]).model.residual.to_dict() == {
        "lns_power": 0.5}


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model.residual.hc_n=8"],
         "config.model.residual.hc_n: pre_ln has no field hc_n; its fields: (none)"),
        (["model.family=mhc", "model.residual.hc_tanh=false"],
         "config.model.residual.hc_tanh: mhc has no field hc_tanh; its fields: hc_n, "
         "hc_scale_init, readout, sinkhorn_iters, sinkhorn_temperature, mhc_bias, mhc_sinkhorn, "
         "mhc_sinkhorn_eps, mhc_rms_eps, mhc_res_layout, mhc_gate_decay, mhc_phi_dtype, "
         "mhc_tanh"),
        ({"model.family": "lns", "model.residual.lns_powr": 0.3},
         "config.model.residual.lns_powr: lns has no field lns_powr; its fields: lns_power"),
    ],
)
def test_an_unknown_residual_field_names_the_familys_fields(base, overrides, message):
    with pytest.raises(ConfigError) as e:
        config.apply_overrides(base, overrides)
    assert str(e.value) == message


def test_family_and_its_fields_in_either_order(base, monkeypatch):
    from depthbench.cli import env_overrides

    first = config.load("micro", ["--config.model.family=hc", "--config.model.residual.hc_n=8"])
    after = config.load("micro", ["--config.model.residual.hc_n=8", "--config.model.family=hc"])
    assert first.to_dict() == after.to_dict() and after.model.residual.hc_n == 8
    as_dict = config.apply_overrides(base, {"model.residual.hc_n": 8, "model.family": "hc"})
    assert as_dict.model.residual.to_dict() == after.model.residual.to_dict()
    # $DEPTHBENCH_OVERRIDES joins the command line's: one override set.
    monkeypatch.setenv("DEPTHBENCH_OVERRIDES", "model.family=hc")
    env = config.load("micro", ["--config.model.residual.hc_n=8", *env_overrides()])
    assert env.to_dict() == after.to_dict()


def test_switching_family_drops_the_old_familys_own_fields(base):
    hc = config.apply_overrides(base, {"model.family": "hc", "model.residual.hc_tanh": False,
                                       "model.residual.hc_n": 2})
    mhc = config.apply_overrides(hc, ["model.family=mhc"])
    # hc_tanh is hc's alone: dropped; hc_n is mhc's too and was set: kept; mhc's others
    # default, readout included (mhc's mean_then_norm: hc's default was not chosen).
    assert mhc.model.residual.to_dict() == {
        "hc_n": 2, "hc_scale_init": 0.01, "readout": "mean_then_norm", "sinkhorn_iters": 20,
        "sinkhorn_temperature": 1.0, "mhc_bias": 8.0, "mhc_sinkhorn": "linear",
        "mhc_sinkhorn_eps": 1e-6, "mhc_rms_eps": 1e-6, "mhc_res_layout": "out_in",
        "mhc_gate_decay": False, "mhc_phi_dtype": "bfloat16", "mhc_tanh": False}
    normed = config.apply_overrides(base, {"model.family": "hc",
                                           "model.residual.readout": "norm_then_sum"})
    assert config.apply_overrides(normed, ["model.family=mhc"]).model.residual.readout == (
        "norm_then_sum")  # chosen: kept
    assert config.apply_overrides(hc, ["model.family=pre_ln"]).model.residual.to_dict() == {}
    # Set in the same override set as the switch: kept (a field of the new family).
    back = config.apply_overrides(mhc, {"model.family": "hc", "model.residual.hc_tanh": False})
    assert back.model.residual.hc_tanh is False and back.model.residual.hc_n == 2
    assert config.validate(back) is back


@pytest.mark.parametrize(
    "override,pattern",
    [
        ("model.residual.hc_n=2.5", r"--config\.model\.residual\.hc_n: expected an integer"),
        ({"model.residual.hc_n": 8.0}, r"config\.model\.residual\.hc_n: expected int, got 8\.0"),
        ({"model.residual.hc_tanh": 1}, r"config\.model\.residual\.hc_tanh: expected bool"),
        ({"model.residual.readout": 3}, r"config\.model\.residual\.readout: expected str"),
    ],
)
def test_residual_overrides_take_the_declared_types(base, override, pattern):
    hc = config.apply_overrides(base, ["model.family=hc"])
    overrides = override if isinstance(override, dict) else [override]
    with pytest.raises(ConfigError, match=pattern):
        config.apply_overrides(hc, overrides)
    hc = config.apply_overrides(hc, {"model.residual.hc_scale_init": 1,  # int -> float
                                     "model.residual.hc_n": "8"})  # text parses as the type
    assert hc.model.residual.hc_scale_init == 1.0 and type(hc.model.residual.hc_scale_init) is float
    assert hc.model.residual.hc_n == 8


def test_a_spec_sets_another_familys_fields(tmp_path):
    spec = tmp_path / "deep_hc.py"
    spec.write_text(
        "from depthbench.configs import micro\n"
        "def get_config():\n"
        "    c = micro.get_config()\n"
        "    c.model.family = 'hc'\n"
        "    c.model.residual.hc_n = 8\n"
        "    c.model.residual.hc_tanh = False\n"
        "    return c\n")
    c = config.load(spec)
    assert c.model.residual.to_dict() == {"hc_n": 8, "hc_scale_init": 0.01,
                                          "readout": "sum_then_norm", "hc_tanh": False,
                                          "hc_write": "mixed"}
    # A spec building on it switches with set_family (a plain assignment keeps
    # hc_tanh, which mhc does not have).
    (tmp_path / "to_mhc.py").write_text(
        "from depthbench import config\n"
        f"hc = config.import_spec({str(spec)!r})\n"
        "def get_config():\n"
        "    c = hc.get_config()\n"
        "    c.model.family = 'mhc'\n"
        "    return c\n")
    with pytest.raises(ConfigError, match=r"residual\.hc_tanh: mhc has no field hc_tanh"):
        config.load(tmp_path / "to_mhc.py")
    (tmp_path / "to_mhc.py").write_text(
        (tmp_path / "to_mhc.py").read_text().replace(
            "c.model.family = 'mhc'", "config.set_family(c, 'mhc', sinkhorn_iters=5)"))
    mhc = config.load(tmp_path / "to_mhc.py")
    assert (mhc.model.family, mhc.model.residual.hc_n) == ("mhc", 8)
    assert mhc.model.residual.sinkhorn_iters == 5 and "hc_tanh" not in mhc.model.residual


def test_validation_reaches_the_familys_checks():
    with pytest.raises(ConfigError, match=r"config\.model\.residual\.hc_n: must be an integer "
                                          r"in \[1, 64\]"):
        config.load("micro", ["model.family=hc", "model.residual.hc_n=0"])
    with pytest.raises(ConfigError, match=r"config\.train\.lr_rule: 'family' needs a family "
                                          r"with a learning-rate rule; pre_ln has none "
                                          r"\(families with one: completep\)"):
        config.load("micro", ["train.lr_rule=family"])
    with pytest.raises(ConfigError, match=r"config\.train\.lr_rule: 'completep' is not one of "
                                          r"none, family"):
        config.load("micro", ["model.family=completep", "train.lr_rule=completep"])
    assert config.load("micro", ["model.family=completep", "train.lr_rule=family"])


# ------------------------------------------- run directories written before

LEGACY = FIXTURES / "legacy_config"


def _legacy(family: str) -> dict:
    import json

    return json.loads((LEGACY / family / "config.json").read_text())


@pytest.mark.parametrize("family", ["pre_ln", "hc", "completep"])
def test_an_old_config_json_loads(family):
    """config.json written by main before per-family configs (every family's 19
    fields; ``train.lr_rule = "completep"`` for a rule) reads as today's config."""
    import ml_collections

    from depthbench.model.spec import ModelSpec

    saved = _legacy(family)
    assert len(saved["model"]["residual"]) == 19  # what main wrote
    loaded = config.from_saved(saved)
    assert len(saved["model"]["residual"]) == 19  # not modified
    # hc's default readout changed since (issue 38): the old run keeps its norm_then_sum.
    kept = ["model.residual.readout=norm_then_sum"] if family == "hc" else []
    fresh = config.load("micro", [f"model.family={family}", *kept])
    assert loaded["model"]["residual"] == fresh.model.residual.to_dict()
    assert loaded["resolved"] == saved["resolved"]
    expected_rule = "family" if family == "completep" else "none"
    assert saved["train"]["lr_rule"] == ("completep" if family == "completep" else "none")
    assert loaded["train"]["lr_rule"] == expected_rule
    restored = ml_collections.ConfigDict({k: v for k, v in loaded.items() if k != "resolved"})
    config.validate(restored)
    assert ModelSpec.from_config(restored) == ModelSpec.from_config(
        config.apply_overrides(fresh, [f"model.depth={saved['model']['depth']}",
                                       f"train.lr_rule={expected_rule}"]))


def test_an_old_run_directory_loads_for_analysis(tmp_path):
    import shutil

    from depthbench.run import init_run

    shutil.copytree(LEGACY / "hc", tmp_path / "run")
    run = init_run(tmp_path / "run")
    assert run.family.name == "hc" and run.family.cfg.hc_n == 4
    assert "lns_power" not in run.config.model.residual


def test_an_old_completep_run_keeps_its_identity():
    """A completep run written with ``train.lr_rule = "completep"`` is the run
    today's config (``"family"``) describes: it resumes, its sweep skips it."""
    from depthbench import run_identity as identity

    saved = _legacy("completep")
    now = config.apply_overrides(config.load("micro"), {
        "model.family": "completep", "train.lr_rule": "family",
        **{k: v for k, v in config.flatten(saved).items()
           if k.startswith(("train.", "data.", "model.")) and not k.startswith("model.residual.")
           and k not in ("model.family", "train.lr_rule")}})
    assert identity.config_changes(saved, now.to_dict()) == []
    without_rule = config.apply_overrides(now, ["train.lr_rule=none"])
    assert identity.config_changes(saved, without_rule.to_dict())
