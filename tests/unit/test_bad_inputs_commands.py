"""Bad input across every command, table-driven (tests/helpers/bad_input_commands.py):
each case exits 2 with exactly one stderr line ``depthbench: error: ...`` naming
the option, field or file and what is allowed, with no traceback and no library
warning before it, and leaves the scratch disk as it was.

The companion of ``tests/unit/test_bad_inputs.py`` (specs, overrides, data,
checkpoints, run directories of ``train``), ``tests/integration/test_bad_inputs_data.py``
(data prepare/tokenize/show) and the import tests: here the option values of
shapes, costs, families, train, sweep, report, analyze, coordcheck, eval, lm-eval
and the imports' --out, sweep specs that fail, the parser's own errors, and the
environment variables the package reads (:data:`ENV_CASES`).  Cases run in-process through
``depthbench.cli.main`` (log records are captured too: a library warning is a
failure); :data:`PROCESS_CASES` run as real processes too, where what a user sees
on stderr is all there is (tests/integration/test_bad_inputs_in_a_process.py).
"""

from __future__ import annotations

import logging
import re
from contextlib import nullcontext

import pytest
from bad_input_commands import (
    CASES,
    ENV_CASES,
    ENV_PROCESS_CASES,
    IMPORT_TIME,
    PROCESS_CASES,
    one_line,
    unchanged,
)

from depthbench.cli import main as cli_main
from depthbench.errors import ConfigError
from depthbench.model.residual.protocol import registry


def test_there_are_at_least_50_new_cases():
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names)) and len(names) >= 50
    assert PROCESS_CASES <= set(names)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, disk, capsys, caplog, monkeypatch):
    name, argv, pattern = case
    monkeypatch.chdir(disk)  # what a case writes to "." (an empty --workdir) is seen
    if name.startswith("lm-eval"):
        pytest.importorskip("lm_eval")
    _refused_without_a_trace(disk, argv, pattern, capsys, caplog)
    noise = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
    assert not noise, noise


def _refused_without_a_trace(disk, argv, pattern, capsys, caplog=None) -> None:
    """The command ``argv(disk)`` run in-process: one line matching ``pattern``,
    exit 2, nothing under ``disk`` changed (``caplog``: its warnings recorded)."""
    result = {}

    def run() -> str:
        capsys.readouterr()
        if caplog is not None:
            caplog.clear()
        with caplog.at_level(logging.WARNING) if caplog is not None else nullcontext():
            try:
                result["code"] = cli_main(argv(disk))
            except SystemExit as e:  # argparse errors
                result["code"] = e.code
        out, err = capsys.readouterr()
        result["out"] = out
        return err

    err = unchanged(disk, run)
    one_line(result["code"], result["out"], err, pattern)


def test_the_environment_table_covers_every_variable():
    names = [c[0] for c in ENV_CASES]
    assert len(names) == len(set(names)) and ENV_PROCESS_CASES <= set(names)
    read = {name.split(":")[0] for name in names}
    assert {"DEPTHBENCH_FAMILIES", "DEPTHBENCH_OVERRIDES", "DEPTHBENCH_MAX_RUNS",
            "DEPTHBENCH_CACHE", "DEPTHBENCH_MALLOC", "DEPTHBENCH_CPU_DOTS"} <= read


@pytest.mark.parametrize("case", [c for c in ENV_CASES if c[0] not in IMPORT_TIME],
                         ids=lambda c: c[0])
def test_bad_environment(case, disk, capsys, monkeypatch):
    """A variable's bad value is one line naming it, exit 2, nothing written."""
    _, variables, argv, pattern = case
    monkeypatch.chdir(disk)
    for name, value in variables(disk).items():
        monkeypatch.setenv(name, value)
    _refused_without_a_trace(disk, argv, pattern, capsys)


@pytest.mark.parametrize("case", [c for c in ENV_CASES if c[0] in IMPORT_TIME],
                         ids=lambda c: c[0])
def test_family_modules_that_fail_are_one_line(case, disk, monkeypatch):
    """$DEPTHBENCH_FAMILIES is read as the package is imported; its loader turns
    whatever a module does wrong into one ConfigError and leaves the registry as
    it was (a real process: tests/integration/test_bad_inputs_in_a_process.py)."""
    _, variables, _, pattern = case
    monkeypatch.syspath_prepend(str(disk / "plugins"))
    before = dict(registry.FAMILIES)
    with pytest.raises(ConfigError) as e:
        registry.load_plugins(variables(disk)["DEPTHBENCH_FAMILIES"])
    assert "\n" not in str(e.value) and re.search(pattern, str(e.value)), str(e.value)
    assert registry.FAMILIES == before


def test_analyze_from_python_refuses_what_the_parser_refuses(disk):
    """The notebook calls analyze() without the parser: the same counts are refused
    there, naming the command-line option (not a ValueError from range())."""
    from depthbench.analysis.analyze import analyze
    from depthbench.analysis.windows import held_out_windows
    from depthbench.errors import ConfigError
    from depthbench.run import load_run

    run = load_run(disk / "run")
    windows = held_out_windows(run, 2, 16)
    for keyword, flag in (("chunk", "--chunk"), ("window_chunk", "--window-chunk"),
                          ("jacobian_windows", "--jacobian-windows")):
        with pytest.raises(ConfigError, match=rf"^{flag}: expected a positive integer, got 0$"):
            analyze(run, windows, ["angular_distance"], progress=False, **{keyword: 0})
