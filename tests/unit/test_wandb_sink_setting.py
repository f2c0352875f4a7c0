"""Weights & Biases as a metrics sink, its setting: ``train.wandb`` is a runtime
field, and a bad value or a missing package is one line and writes nothing (the
sink itself, which starts W&B's service process: tests/integration/test_wandb_sink.py)."""

from __future__ import annotations

import sys

import pytest

from depthbench import config as config_lib
from depthbench import run_identity as identity
from depthbench.cli import main as cli_main


def test_wandb_is_a_runtime_field():
    base = config_lib.base_config()
    other = config_lib.base_config()
    other.train.wandb = "offline"
    assert identity.config_changes(base.to_dict(), other.to_dict()) == []
    assert identity.is_runtime_field("train.wandb")


@pytest.mark.parametrize("mode, without_wandb, said", [
    ("yes", False, "'yes' is not one of '', 'offline', 'online'"),
    ("offline", True, "'offline' needs the wandb package: pip install 'depthbench[wandb]'"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, mode,
                                                  without_wandb, said):
    if without_wandb:
        monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    workdir = tmp_path / "run"
    assert cli_main(["train", "--config", str(config_lib.base_spec_path()), "--workdir",
                     str(workdir), f"--config.train.wandb={mode}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"depthbench: error: config.train.wandb: {said}"]
    assert not workdir.exists()
