"""``depthbench data tokenize``'s preflight, in-process: a bad line near the start
of an input is found before any worker starts, one further on is left to the
workers (the worker pool itself: tests/integration/test_data_tokenize.py)."""

from __future__ import annotations

import json

import pytest

from depthbench.config import ConfigError
from depthbench.data import tokenize as tokenize_lib


def test_preflight_reads_only_the_start_of_each_file(tmp_path, monkeypatch):
    """A bad line past PREFLIGHT_BYTES is left to the workers; one before it is found
    up front, and so are inputs wholly read and holding no document."""
    monkeypatch.setattr(tokenize_lib.inputs, "PREFLIGHT_BYTES", 200)
    inputs = tokenize_lib.inputs
    path = tmp_path / "a.jsonl"
    line = json.dumps({"text": "x" * 50}) + "\n"
    path.write_text(line * 10 + "{bad\n")
    units = inputs.plan_units([path], "text")
    inputs.preflight(units, "text")  # the bad line starts at byte 610
    path.write_text(line * 2 + "{bad\n")
    with pytest.raises(ConfigError, match=r"a\.jsonl:3 is not JSON"):
        inputs.preflight(inputs.plan_units([path], "text"), "text")
    path.write_text('{"text": ""}\n' * 5)
    with pytest.raises(ConfigError, match=r"--input: the 1 file\(s\) hold no documents"):
        inputs.preflight(inputs.plan_units([path], "text"), "text")
    path.write_text('{"text": ""}\n' * 50)  # more than the preflight reads: left to the run
    inputs.preflight(inputs.plan_units([path], "text"), "text")
