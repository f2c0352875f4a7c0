"""A family from outside the package joins through the registry's public hook
and every consumer picks it up with no other edit: its typed config and
variants, the sharding rules, costs, `depthbench families`, the shared family
tests and `depthbench train`."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from paths import REPO

from depthbench import config as config_lib
from depthbench import costs, parallel, variants
from depthbench.errors import ConfigError
from depthbench.model.residual import registry
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer
from depthbench.shapes import Shape

# The whole family: one module.  x <- x + toy_scale * g_j * F(N(x)) with a
# learned gain g_j per sublayer (init 1) on a logical axis of its own; a
# typed config with a variant, and cost terms.
TOY = '''
import dataclasses

from flax import linen as nn

from depthbench.model.residual import registry
from depthbench.model.residual.base import ResidualFamily, family_param, gate
from depthbench.model.residual.capabilities import CostTerms, Variants
from depthbench.model.residual.fields import FamilyConfig, check_number


@dataclasses.dataclass(frozen=True)
class ToyConfig(FamilyConfig, Variants):
    toy_scale: float = 0.5
    toy_gain_init: float = 1.0

    variants = {"tiny_scale": {"toy_scale": 0.125}}

    def validate(self, config):
        check_number("toy_scale", self.toy_scale, 0.0, exclusive=True)


@registry.register
@dataclasses.dataclass(frozen=True)
class ToyScaled(ResidualFamily, CostTerms):
    name = "toy_scaled"
    description = "x <- x + toy_scale * g_j * F(N(x))"
    reference = "tests/test_family_plugin.py"
    Config = ToyConfig
    sharding_rules = (("toy_gains", None),)

    def create_block_params(self, mod, ident):
        init = nn.initializers.constant(self.cfg.toy_gain_init)
        return {"gain": family_param(mod, "gain", init, (2,), ("toy_gains",))}

    def write(self, p, state, y, site, aux, active):
        scale = self.cfg.toy_scale * p["gain"][site.sub].astype(y.dtype)
        return gate(active, state + scale * y, state)

    def extra_block_params(self):
        return 2
'''

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


def _env(tmp_path: Path) -> dict:
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, DEPTHBENCH_FAMILIES="toy_family")


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
    logits, variables = zero.init_with_output(jax.random.key(0), tokens)
    skipped = zero.apply(variables, tokens, active=jnp.zeros(SHAPE.depth, bool))
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

    from depthbench.model.residual.fields import FamilyConfig

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
        logits = Transformer(spec).init_with_output(jax.random.key(0), tokens)[0]
        assert logits.shape == (1, 4, SHAPE.vocab_size) and bool(jnp.all(jnp.isfinite(logits)))
    finally:
        registry.unregister(cls.name)


@pytest.mark.slow
def test_every_consumer_picks_up_a_registered_family(tmp_path):
    (tmp_path / "toy_family.py").write_text(TOY)
    env = _env(tmp_path)
    cli = [sys.executable, "-m", "depthbench"]

    def run(*args, **kw):
        out = subprocess.run([*args], env=env, capture_output=True, text=True, timeout=600,
                             **kw)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        return out.stdout

    families = {r["name"]: r for r in json.loads(run(*cli, "families", "--json"))}
    assert families["toy_scaled"]["extra_block_params"] == 2
    rows = json.loads(run(*cli, "costs", "--suite", "micro", "--depths", "4", "--seq-len", "128",
                          "--family", "toy_scaled", "--json"))
    assert [r["family"] for r in rows] == ["toy_scaled"]
    # The shared family tests, parametrised over the registry, run on it.  (The
    # sharded-vs-single-device check loops over registry.names() in one 8-device
    # subprocess that inherits DEPTHBENCH_FAMILIES; it is left out here only for
    # time: it would run all fourteen families.)
    shared = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                 "no:xdist", str(REPO / "tests" / "test_families_shared.py"),
                 "-k", "toy_scaled", cwd=REPO)
    passed = int(shared.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert passed >= 9, shared[-1000:]
    workdir = tmp_path / "run"
    run(*cli, "train", "--config", "micro", "--workdir", str(workdir), "--no-progress",
        "--config.model.residual.toy_scale=0.25", "--config.model.family=toy_scaled",
        "--config.train.steps=3", "--config.train.batch_size=4", "--config.train.seq_len=32",
        "--config.train.eval_every=3", "--config.train.checkpoint_every=3",
        "--config.train.layer_stats_every=0", "--config.data.val_windows=4")
    result = json.loads((workdir / "result.json").read_text())
    assert result["family"] == "toy_scaled" and result["status"] == "finished"
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"]["residual"] == {"toy_scale": 0.25, "toy_gain_init": 1.0}
