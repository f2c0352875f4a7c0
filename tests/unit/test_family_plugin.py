"""A family from outside the package joins through the registry's public hook
and every consumer picks it up with no other edit: its typed config and
variants, the sharding rules and costs, in this process (`depthbench families`,
the shared family tests and `depthbench train` in processes of their own:
tests/integration/test_family_plugin_consumers.py)."""

from __future__ import annotations

import importlib
import re
import sys

import jax
import jax.numpy as jnp
import pytest
from paths import REPO
from toy_family_source import TOY

from depthbench import config as config_lib
from depthbench import costs, parallel, variants
from depthbench.errors import ConfigError
from depthbench.model.residual.protocol import registry
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer
from depthbench.shapes import Shape

SHAPE = Shape(2, 32, 96, 4, 4, 64)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy module on sys.path, registered in this process (removed afterwards)."""
    (tmp_path / "toy_family.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_family", raising=False)
    importlib.import_module("toy_family")
    yield tmp_path
    registry.unregister("toy_scaled")
    sys.modules.pop("toy_family", None)


def test_registering_extends_config_rules_and_costs(toy):
    assert registry.names()[-1] == "toy_scaled"
    assert "toy_scale" not in config_lib.base_config().model.residual  # pre_ln's: none
    assert ("toy_gains", None) in parallel.axis_rules()
    config = config_lib.apply_overrides(config_lib.base_config(), {
        "model.residual.toy_scale": 0.25, "model.family": "toy_scaled"})
    assert config_lib.validate(config).model.residual.to_dict() == {
        "toy_scale": 0.25, "toy_gain_init": 1.0}  # the family's fields, no other's
    with pytest.raises(ConfigError, match=r"config\.model\.residual\.toy_scale: must be"):
        config_lib.validate(config_lib.apply_overrides(config, {"model.residual.toy_scale": 0.0}))
    with pytest.raises(ConfigError, match=r"toy_scale: expected float, got 'big'|expected a "
                                          r"number, got 'big'"):
        config_lib.apply_overrides(config, ["model.residual.toy_scale=big"])
    with pytest.raises(ConfigError, match=r"toy_scaled has no field hc_n; its fields: "
                                          r"toy_scale, toy_gain_init"):
        config_lib.apply_overrides(config, ["model.residual.hc_n=2"])
    spec = ModelSpec.from_shape(SHAPE, family="toy_scaled")
    pre_ln = ModelSpec.from_shape(SHAPE, family="pre_ln")
    assert costs.param_count(spec) == costs.param_count(pre_ln) + 2 * SHAPE.depth
    # The model reads the typed fields: a gain init of 0 makes every block the identity.
    tokens = jnp.arange(8, dtype=jnp.int32)[None] % SHAPE.vocab_size
    zero = Transformer(spec.with_fields(toy_gain_init=0.0))
    (logits, _), variables = jax.jit(zero.init_with_output)(jax.random.key(0), tokens)
    skipped, _ = jax.jit(zero.apply)(variables, tokens, active=jnp.zeros(SHAPE.depth, bool))
    assert jnp.array_equal(logits, skipped)
    # Its variant, declared in its config, reaches a sweep entry.
    entry = variants.expand_entry({"model.family": "toy_scaled+tiny_scale", "model.depth": 2})
    assert entry == {"model.family": "toy_scaled", "model.depth": 2,
                     "model.residual.toy_scale": 0.125}
    assert config_lib.apply_overrides(config, entry).model.residual.toy_scale == 0.125
    with pytest.raises(ConfigError, match=r"variant 'depth_mup' in 'toy_scaled\+depth_mup' is "
                                          r"not one of toy_scaled's: tiny_scale, "
                                          r"norms_embeddings_residual"):
        variants.split("toy_scaled+depth_mup")


def test_registering_checks_the_declarations(toy):
    import dataclasses

    from depthbench.model.residual.protocol.family_config import FamilyConfig

    toy_cls = registry.get("toy_scaled")

    def family(name, config):
        return type(name.title(), (toy_cls,), {"name": name, "Config": config})

    # A second family may not take the name, nor redeclare a field with another
    # type; it may default a shared field its own way (mhc's readout is not hc's),
    # and a switch to it takes its default unless the field was set.
    own_default = dataclasses.make_dataclass("OwnDefaultConfig", [("hc_n", int, 3)],
                                             bases=(FamilyConfig,), frozen=True)
    registry.register(family("own_default", own_default))
    try:
        switched = config_lib.set_family(config_lib.set_family(config_lib.base_config(), "hc"),
                                         "own_default")
        assert switched.model.residual.hc_n == 3
        chosen = config_lib.set_family(config_lib.set_family(config_lib.base_config(), "hc",
                                                             hc_n=8), "own_default")
        assert chosen.model.residual.hc_n == 8
    finally:
        registry.unregister("own_default")
    retyped = dataclasses.make_dataclass("RetypedConfig", [("hc_n", float, 4.0)],
                                         bases=(FamilyConfig,), frozen=True)
    with pytest.raises(ValueError, match="'hc_n'"):
        registry.register(family("retyped", retyped))
    listed = dataclasses.make_dataclass("ListConfig", [("sizes", list, None)],
                                        bases=(FamilyConfig,), frozen=True)
    with pytest.raises(TypeError, match=r"sizes is a <class 'list'>, not bool, int, float"):
        registry.register(family("listed", listed))
    with pytest.raises(TypeError, match="not a frozen FamilyConfig dataclass"):
        registry.register(family("loose", dict))
    bad_variant = type("BadVariantConfig", (toy_cls.Config,), {"variants": {"v": {"nope": 1}}})
    with pytest.raises(TypeError, match=r"variant 'v': .*toy_scaled_v has no field nope"):
        registry.register(family("toy_scaled_v", bad_variant))
    assert not {"own_default", "retyped", "listed", "loose", "toy_scaled_v"} & set(
        registry.names())


def test_readme_adding_a_family_is_one_file_and_one_line():
    """The README's example family is a working family, and its registry line has
    the form of the registry's table."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("**A family.**", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, "one file and one line"
    namespace: dict = {"__name__": "readme_family"}
    # A file of its own: not under this test module's `from __future__ import annotations`.
    code = compile(blocks[0], "README.md", "exec", dont_inherit=True)
    exec(code, namespace)  # noqa: S102 (our own README)
    line = blocks[1].strip()
    assert re.fullmatch(r'"(\w+):(\w+)",', line), line
    module, cls_name = line.strip('",').split(":")
    cls = namespace[cls_name]
    assert cls.name == module  # the family's file is named after it
    registry.register(cls)
    try:
        assert cls.name in registry.names()
        config = config_lib.apply_overrides(config_lib.base_config(), {"model.family": cls.name})
        config_lib.validate(config)
        assert config.model.residual.to_dict() == cls.config_fields()
        spec = ModelSpec.from_shape(SHAPE, family=cls.name)
        tokens = jnp.zeros((1, 4), jnp.int32)
        (logits, _), _ = Transformer(spec).init_with_output(jax.random.key(0), tokens)
        assert logits.shape == (1, 4, SHAPE.vocab_size) and bool(jnp.all(jnp.isfinite(logits)))
    finally:
        registry.unregister(cls.name)


