"""Spec loading, override parsing and validation: each failure is one ConfigError line
naming the field."""

from pathlib import Path

import pytest

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
            "model.residual.hc_tanh=false",
            "model.budget=400M",
            "model.rope_theta=500000",
            "model.suite=''",
            'model.family="pre_ln"',
        ],
    )
    assert c.model.depth == 8 and type(c.model.depth) is int
    assert c.train.lr == 5e-4 and type(c.train.lr) is float
    assert c.train.steps == 2000 and type(c.train.steps) is int
    assert c.model.residual.hc_tanh is False
    assert c.model.budget == 4e8 and type(c.model.budget) is float
    assert c.model.rope_theta == 500000.0 and type(c.model.rope_theta) is float
    assert c.model.suite == "" and c.model.family == "pre_ln"
    assert base.model.depth == 4  # the input config is not modified
    for text, value in (("true", True), ("1", True), ("on", True), ("no", False)):
        assert (
            config.apply_overrides(base, [f"model.residual.hc_tanh={text}"]).model.residual.hc_tanh
            is value
        )


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
        config.apply_overrides(base, [override])
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
