"""`depthbench shapes | costs | families` and config validation through the CLI, in-process
(``depthbench.cli.main`` returns the exit status); the console script itself runs in
tests/integration/test_cli_entry_point.py."""

import dataclasses
import json
import sys
import types

import pytest

from depthbench import cli, config, costs, shapes
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.base import ResidualFamily
from depthbench.model.residual.protocol.capabilities import CostTerms
from depthbench.model.spec import ModelSpec


def run(argv):
    """Exit status of ``depthbench argv`` (argparse usage errors raise SystemExit)."""
    try:
        return cli.main(list(argv))
    except SystemExit as e:
        return e.code


def one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# ------------------------------------------------------------------------ shapes


def test_shapes_suite_json_is_the_table(capsys):
    assert run(["shapes", "--suite", "paper-400m", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["depth"], r["d_model"], r["d_ff"]) for r in rows] == [
        (16, 1216, 3248),
        (20, 1120, 2992),
        (24, 1024, 2736),
        (28, 960, 2560),
        (32, 896, 2400),
        (42, 800, 2144),
        (70, 640, 1712),
    ]
    assert set(rows[0]) == {
        "depth",
        "d_model",
        "d_ff",
        "n_heads",
        "n_kv_heads",
        "head_dim",
        "aspect_ratio",
        "backbone_params",
        "total_params",
    }
    assert rows[2]["total_params"] == 405_406_720 and rows[2]["head_dim"] == 64
    assert rows[0]["aspect_ratio"] == 76.0


def test_shapes_suite_human_table(capsys):
    assert run(["shapes", "--suite", "paper-400m"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("suite paper-400m:") and "400.0M total" in lines[0]
    assert lines[1].split()[:3] == ["depth", "d_model", "d_ff"]
    assert len(lines) == 3 + 7
    assert len({len(line) for line in lines[1:]}) == 1  # aligned: every row as wide
    row24 = lines[5].split()
    assert row24[:3] == ["24", "1024", "2736"] and row24[-2:] == ["405.4M", "+1.35%"]


def test_shapes_budget_rule(capsys):
    argv = ["shapes", "--budget", "400M", "--vocab", "50280", "--depths", "16,24,70", "--json"]
    assert run(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["depth"], r["d_model"], r["d_ff"]) for r in rows] == [
        (16, 1216, 3248),
        (24, 1024, 2736),
        (70, 640, 1712),
    ]
    assert run(["shapes", "--budget", "300M", "--fix", "backbone", "--depths", "70"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("shape rule: budget 300.0M backbone parameters")
    assert out.splitlines()[-1].split()[:3] == ["70", "608", "1632"]


def test_shapes_suite_depth_selection_and_gqa_heads(capsys):
    assert run(["shapes", "--suite", "paper-1p6b", "--depths", "40", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["d_model"], row["n_heads"], row["n_kv_heads"], row["head_dim"]) == (
        1728,
        16,
        8,
        108,
    )


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["shapes", "--suite", "paper-9b"], ["--suite: 'paper-9b' is unknown", "paper-400m"]),
        (["shapes", "--budget", "400M", "--depths", "16,x"], ["--depths:", "'16,x'"]),
        (["shapes", "--budget", "400M", "--depths", "0"], ["--depths:"]),
        (["shapes", "--budget", "400M", "--depths", ","], ["--depths:"]),
        (["shapes", "--budget", "400M"], ["--depths: required with --budget"]),
        (["shapes", "--budget", "lots", "--depths", "16"], ["--budget:", "'lots'"]),
        (["shapes", "--budget=-5M", "--depths", "16"], ["--budget:", "'-5M'"]),
        (["shapes", "--budget", "0", "--depths", "16"], ["--budget:"]),
        (
            ["shapes", "--budget", "1k", "--depths", "64"],
            ["--depths: depth 64 cannot meet", "raise --budget"],
        ),
        (
            ["shapes", "--suite", "paper-400m", "--depths", "17"],
            ["--depths: suite 'paper-400m' has no depth 17", "16, 20"],
        ),
        (["shapes", "--suite", "paper-400m", "--fix", "backbone"], ["--fix: applies only"]),
        (["shapes", "--budget", "400M", "--depths", "16", "--heads", "x"], ["--heads:"]),
        (
            ["shapes", "--budget", "400M", "--depths", "16", "--kv-heads", "3"],
            ["--kv-heads: 3 must divide --heads 16"],
        ),
        (["shapes", "--budget", "400M", "--depths", "16", "--vocab", "-1"], ["--vocab:"]),
    ],
)
def test_shapes_bad_input(capsys, argv, needles):
    assert run(argv) == 2
    one_line_error(capsys, "depthbench: error:", *needles)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["shapes"], "one of the arguments --suite --budget is required"),
        (["shapes", "--suite", "micro", "--budget", "1M"], "not allowed with argument"),
        (["shapes", "--suite", "micro", "--config.model.depth=3"], "takes no --config"),
        (["shapes", "--suite", "micro", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_shapes_usage_errors(capsys, argv, needle):
    assert run(argv) == 2
    one_line_error(capsys, needle)


# ------------------------------------------------------------------------- costs


def test_costs_json_rows_are_cost_rows(capsys):
    assert run(["costs", "--suite", "paper-400m", "--seq-len", "4096", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    specs = [ModelSpec.from_shape(s, "pre_ln") for s in shapes.suite("paper-400m").shapes()]
    assert rows == [costs.cost_row(spec, 4096) for spec in specs]
    assert rows[2]["kv_cache_bytes"] == 384 * 2**20


def test_costs_human_table(capsys):
    assert run(["costs", "--suite", "paper-400m", "--seq-len", "4096"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "family pre_ln, sequence length 4096"
    assert "prefill FLOPs" in lines[2] and "KV cache" in lines[2]
    assert len(lines) == 4 + 7 + 2 and len({len(line) for line in lines[2:-2]}) == 1
    # Which number reproduces the original benchmark's "3.0 -> 4.4 TFLOPs".
    assert lines[-1].startswith('note: the original benchmark quotes "3.0 -> 4.4 TFLOPs"')
    assert "2.98T -> 4.33T (with the head 3.48T -> 4.59T)" in lines[-1]
    row24 = lines[6].split()
    spec = ModelSpec.from_shape(shapes.suite("paper-400m").shape(24), "pre_ln")
    assert row24[:4] == ["24", "1024", "42.67", "405.4M"]
    assert row24[4] == "3.30T"
    assert costs.prefill_flops(spec, 4096) == pytest.approx(3.30e12, rel=2e-3)
    # 2 * 24 * 4096 * 1024 * 2 B = 384 MiB of KV cache; 1024 * 2 B of state per token.
    assert row24[7:] == ["384", "MiB", "2.00", "KiB", "+0.00%", "+0.00%"]


def test_costs_budget_and_all_families(capsys):
    argv = [
        "costs",
        "--budget",
        "400M",
        "--depths",
        "16,70",
        "--seq-len",
        "2048",
        "--family",
        "all",
        "--json",
    ]
    assert run(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    names = registry.names()
    assert [r["family"] for r in rows] == [n for n in names for _ in (16, 70)]
    assert [r["depth"] for r in rows] == [16, 70] * len(names)
    assert run(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("family ")] == [
        f"family {n}, sequence length 2048" for n in names
    ]


@pytest.mark.parametrize(
    "argv,needles",
    [
        (
            ["costs", "--suite", "micro", "--seq-len", "128", "--family", "resnet"],
            ["--family: 'resnet' is not one of", "pre_ln", "all"],
        ),
        (["costs", "--suite", "micro", "--seq-len", "0"], ["--seq-len:"]),
        (["costs", "--suite", "micro", "--seq-len", "long"], ["--seq-len:"]),
        (["costs", "--suite", "nope", "--seq-len", "128"], ["--suite: 'nope' is unknown"]),
        (["costs", "--budget", "4e8", "--depths", "16;24", "--seq-len", "128"], ["--depths:"]),
    ],
)
def test_costs_bad_input(capsys, argv, needles):
    assert run(argv) == 2
    one_line_error(capsys, *needles)


def test_costs_requires_seq_len(capsys):
    assert run(["costs", "--suite", "micro"]) == 2
    one_line_error(capsys, "--seq-len")


# ---------------------------------------------------- a family added to the registry


@dataclasses.dataclass(frozen=True)
class _Wide(ResidualFamily, CostTerms):
    name = "wide_test"
    description = "test family: three streams"
    reference = "nobody 2099"

    def extra_block_params(self) -> int:
        return 5 * self.spec.d_model + 1

    def extra_global_params(self) -> int:
        return 3

    def state_floats_per_token(self) -> int:
        return 3 * self.spec.d_model


def test_commands_see_any_registered_family(monkeypatch, capsys):
    monkeypatch.setitem(registry.FAMILIES, _Wide.name, _Wide)
    assert run(["families", "--json", "--d-model", "640", "--depth", "70"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(registry.names())
    wide = rows["wide_test"]
    assert (wide["extra_block_params"], wide["extra_global_params"]) == (5 * 640 + 1, 3)
    assert wide["state_floats_per_token"] == 1920 and wide["reference"] == "nobody 2099"
    assert rows["pre_ln"]["extra_block_params"] == 0
    assert rows["pre_ln"]["state_floats_per_token"] == 640
    argv = [
        "costs",
        "--suite",
        "micro",
        "--depths",
        "2",
        "--seq-len",
        "64",
        "--family",
        "wide_test",
        "--json",
    ]
    assert run(argv) == 0
    (row,) = json.loads(capsys.readouterr().out)
    micro2 = shapes.suite("micro").shape(2)
    assert row["params"] == micro2.total_params + 2 * (5 * 152 + 1) + 3
    assert row["state_bytes_per_token"] == 3 * 152 * 2


def test_families_human_table(capsys):
    assert run(["families"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"{len(registry.names())} residual families; extra parameters at d_model 1024, depth 24"
    )
    assert lines[1].split()[0] == "family"
    n = len(registry.names())
    assert [line.split()[0] for line in lines[3 : 3 + n]] == registry.names()
    assert lines[3 + n : 5 + n] == [
        "", "references (full descriptions: depthbench families --json):"]
    # One entry per family, long ones wrapped onto indented lines.
    assert [line.split()[0] for line in lines[5 + n :] if line[2] != " "] == registry.names()
    assert max(len(line) for line in lines) <= 100


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["families", "--d-model", "100"], "--d-model: expected a positive multiple of 32"),
        (["families", "--d-model", "wide"], "--d-model:"),
        (["families", "--depth", "0"], "--depth:"),
    ],
)
def test_families_bad_input(capsys, argv, needle):
    assert run(argv) == 2
    one_line_error(capsys, needle)


# ---------------------------------------------------------------------- help


@pytest.mark.parametrize("command", ["shapes", "costs", "families", "generate"])
def test_help_has_examples(capsys, command):
    assert run([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"depthbench {command}" in out


# ------------------------------------------- config validation through main()


@pytest.fixture
def probe(monkeypatch):
    """A throw-away sub-command that loads a spec with overrides (as `train` will)."""

    def register(subparsers):
        p = subparsers.add_parser("probe")
        p.add_argument("spec", nargs="?", default=str(config.base_spec_path()))
        p.set_defaults(func=handler, accepts_overrides=True)

    def handler(args):
        c = config.load(args.spec, args.overrides)
        print(shapes.resolve_shape(c).d_model)
        return 0

    module = types.ModuleType("depthbench.cli._probe")
    module.register = register
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(cli, "COMMANDS", {**cli.COMMANDS, "probe": "_probe"})
    return lambda *argv: run(["probe", *argv])


def test_probe_accepts_good_overrides(probe, capsys):
    assert probe("--config.model.depth=10") == 0
    assert capsys.readouterr().out.strip() == "80"
    assert (
        probe(
            "--config.model.suite=''",
            "--config.model.budget=1.2M",
            "--config.model.n_heads=4",
            "--config.model.depth=2",
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == "152"


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["--config.model.widht=3"], "--config.model.widht: unknown field"),
        (["--config.model.family=resnet"], "config.model.family: 'resnet' is not one of"),
        (
            ["--config.model.suite=''", "--config.model.d_model=100", "--config.model.n_heads=16"],
            "config.model.n_heads: 16 heads do not divide d_model 100",
        ),
        (
            ["--config.model.suite=''", "--config.model.budget=1000", "--config.model.depth=64"],
            "config.model.depth: depth 64 cannot meet",
        ),
        (["--config.model.depth=5"], "config.model.depth: suite 'micro' has no depth 5"),
        (["--config.model.depth=0"], "config.model.depth: must be a number > 0"),
        (["--config.train.batch_size=-4"], "config.train.batch_size: must be a number > 0"),
        (["--config.train.lr=0"], "config.train.lr: must be a number > 0"),
        (["--config.train.lr=-3e-3"], "config.train.lr: must be a number > 0"),
        (["--config.model.depth=two"], "--config.model.depth: expected an integer"),
        (["--config.model.depth"], "expected --config.section.field=value"),
    ],
)
def test_probe_validation_errors(probe, capsys, overrides, needle):
    assert probe(*overrides) == 2
    one_line_error(capsys, "depthbench: error:", needle)


def test_probe_bad_spec_files(probe, capsys, tmp_path):
    assert probe(str(tmp_path / "missing.py")) == 2
    one_line_error(capsys, "missing.py' does not exist")
    empty = tmp_path / "empty.py"
    empty.write_text("import ml_collections\n")
    assert probe(str(empty)) == 2
    one_line_error(capsys, "empty.py' has no get_config()")
