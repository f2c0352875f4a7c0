"""depthbench.cpu_dots: the CPU dot library per vendor, the override, a bad value."""

from __future__ import annotations

import os

import pytest

from depthbench import cpu_dots
from depthbench.errors import ConfigError


@pytest.fixture
def vendor(monkeypatch):
    def set_vendor(name):
        monkeypatch.setattr(cpu_dots, "cpu_vendor", lambda: name)
    return set_vendor


@pytest.mark.parametrize("name,expected", [("AuthenticAMD", "eigen"), ("GenuineIntel", "ynnpack"),
                                           ("ARM", "ynnpack")])
def test_auto_follows_the_vendors_measurement(monkeypatch, vendor, name, expected):
    monkeypatch.setenv(cpu_dots.ENV, "auto")
    vendor(name)
    assert cpu_dots.choice() == expected == cpu_dots.FASTER.get(name, "ynnpack")


@pytest.mark.parametrize("value", ["eigen", "ynnpack"])
def test_the_switch_wins_over_the_vendor(monkeypatch, vendor, value):
    monkeypatch.setenv(cpu_dots.ENV, value)
    vendor("AuthenticAMD")
    assert cpu_dots.choice() == value


def test_apply_adds_the_flag_once_and_leaves_a_users_flag(monkeypatch, vendor):
    vendor("AuthenticAMD")
    monkeypatch.setenv(cpu_dots.ENV, "auto")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert "Eigen" in cpu_dots.apply()
    assert cpu_dots.apply().startswith("as XLA_FLAGS sets")  # a second call adds nothing
    assert os.environ["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=2 "
                                       "--xla_cpu_experimental_ynn_fusion_type=reduce")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=dot")
    cpu_dots.apply()
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_experimental_ynn_fusion_type=dot"
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv(cpu_dots.ENV, "ynnpack")
    assert "YNNPACK" in cpu_dots.apply() and os.environ["XLA_FLAGS"] == ""


def test_a_bad_value_is_a_config_error_naming_the_variable(monkeypatch):
    # the command's one line and exit 2: tests/helpers/bad_input_commands.py's ENV_CASES
    monkeypatch.setenv(cpu_dots.ENV, "mkl")
    with pytest.raises(ConfigError, match=r"DEPTHBENCH_CPU_DOTS: 'mkl' is not one of auto"):
        cpu_dots.setting()
