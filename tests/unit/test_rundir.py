"""The run-directory layer (unit): the torn-line rule every JSON-lines reader
follows, damaged JSON records, logs continued by a resumed run, JSON-safe
values, and the compile cache keyed by the fields its functions are built
from (a different list from the runtime fields of a run's identity)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from analysis_tiny import tiny_config

from depthbench import run_identity as identity
from depthbench.rundir import io
from depthbench.rundir.io import DamagedFile, JsonlLog, read_json, read_jsonl
from depthbench.train import compiled

ROWS = [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.5}, {"step": 3, "loss": 3.25}]
TEXT = "".join(json.dumps(r) + "\n" for r in ROWS)


# ------------------------------------------------------------ the torn-line rule

# file text -> the rows read, or (the line named, the rows before it) for damage
TORN_LINE_RULE = {
    "whole": (TEXT, ROWS),
    "empty": ("", []),
    "blank lines": ("\n" + TEXT.replace("\n", "\n\n"), ROWS),
    "last line torn (no newline)": (TEXT + '{"step": 4, "lo', ROWS),
    "last line whole, no newline": (TEXT + '{"step": 4}', [*ROWS, {"step": 4}]),
    "garbage in the middle": (TEXT.replace('{"step": 2', '{"step": #'), ("line 2", ROWS[:1])),
    "a bad last line with its newline": (TEXT + '{"step": 4, "lo\n', ("line 4", ROWS)),
    "a line that is not an object": (TEXT + "[4]\n", ("line 4", ROWS)),
    "a torn line that is not an object": (TEXT + "7", ("line 4", ROWS)),
}


@pytest.mark.parametrize("case", list(TORN_LINE_RULE))
def test_the_torn_line_rule(tmp_path, case):
    text, expected = TORN_LINE_RULE[case]
    path = tmp_path / "metrics.jsonl"
    path.write_text(text)
    if isinstance(expected, list):
        assert read_jsonl(path) == expected
        return
    line, before = expected
    with pytest.raises(DamagedFile) as e:
        read_jsonl(path)
    assert e.value.path == path and e.value.reason.startswith(f"{line} ")
    assert str(e.value).startswith(f"{path}: {line} ") and e.value.rows == before


def test_a_missing_log_has_no_rows_and_bytes_that_are_not_text_are_damage(tmp_path):
    assert read_jsonl(tmp_path / "none.jsonl") == []
    (tmp_path / "x.jsonl").write_bytes(b'{"step": 1}\n\xff\xfe\n')
    with pytest.raises(DamagedFile, match="is not UTF-8 text"):
        read_jsonl(tmp_path / "x.jsonl")


def test_json_records(tmp_path):
    path = tmp_path / "result.json"
    assert read_json(path) is None
    io.atomic_write_json(path, {"loss": 2.5, "steps": 4})
    assert read_json(path) == {"loss": 2.5, "steps": 4}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary left
    for text, reason in (('{"loss": 2.', "is not JSON (Expecting ',' delimiter: line 1 column 11)"),
                         ("[1, 2]", "holds a JSON list, not an object"),
                         ("", "is not JSON (Expecting value: line 1 column 1)")):
        path.write_text(text)
        with pytest.raises(DamagedFile) as e:
            read_json(path)
        assert e.value.reason == reason and str(e.value) == f"{path}: {reason}"


# --------------------------------------------------------- a log a run continues


def test_a_resumed_log_keeps_the_rows_up_to_its_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = JsonlLog(path, 0)
    assert not path.exists()  # nothing written, no file
    for row in ROWS:
        log.append(row)
    log.close()
    path.write_text(path.read_text() + '{"step": 4, "lo')  # killed mid-write
    log = JsonlLog(path, 2)  # resumed from the step-2 checkpoint
    log.append({"step": 3, "loss": 3.0})
    log.close()
    assert read_jsonl(path) == [*ROWS[:2], {"step": 3, "loss": 3.0}]


def test_a_damaged_log_is_set_aside_and_its_rows_before_the_damage_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    damaged = TEXT.replace('{"step": 3', "garbage")
    path.write_text(damaged)
    said = []
    log = JsonlLog(path, 3, warn=said.append)
    log.close()
    assert read_jsonl(path) == ROWS[:2]
    assert (tmp_path / "metrics.jsonl.damaged").read_text() == damaged
    assert said == [f"depthbench: warning: {path}: line 3 is not JSON (Expecting value); moved to "
                    f"{tmp_path / 'metrics.jsonl.damaged'}, keeping the 2 row(s) before it"]
    path.write_text("[]\n")
    JsonlLog(path, 3).close()
    assert (tmp_path / "metrics.jsonl.damaged.1").read_text() == "[]\n"  # the first is kept


def test_json_safe_values():
    value = {"a": float("nan"), 1: (np.float32(0.5), np.int64(3)), "b": [float("inf"), None],
             "c": np.arange(3), "d": {"e": np.bool_(True)}, "f": object}
    safe = io.json_safe(value)
    assert safe == {"a": None, "1": [0.5, 3], "b": [None, None], "c": [0, 1, 2],
                    "d": {"e": True}, "f": str(object)}
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe
    assert [io.finite(x) for x in (1.0, 0, math.nan, None, "1", True)] == [
        True, True, False, False, False, False]


# ------------------------------------------------------------- the compile cache


def test_the_compile_cache_is_keyed_by_the_fields_its_functions_are_built_from():
    config = tiny_config("hc", 2)
    read = compiled.fields_read(config)
    # What the model, the optimizer and schedule, the batch and the mesh are built from ...
    for field in ("model.depth", "model.d_model", "model.residual.hc_n", "train.lr",
                  "train.steps", "train.b2", "train.microbatches", "train.seq_len",
                  "parallel.fsdp"):
        assert field in read, field
    # ... and not what only the host reads.
    for field in ("train.seed", "train.log_every", "train.max_loss", "data.corpus", "name"):
        assert field not in read, field
    first = compiled.compiled(config)
    same = tiny_config("hc", 2, **{"train.seed": 7, "train.log_every": 3, "name": "other"})
    assert compiled.compiled(same) is first  # nothing new compiled
    other = tiny_config("hc", 2, **{"train.lr": 0.5})
    assert compiled.compiled(other) is not first


def test_runtime_fields_and_compile_fields_are_two_concepts():
    """The seed changes what a run computes but not its program; the mesh the
    program but not what a run computes."""
    config = tiny_config("hc", 2)
    read = compiled.fields_read(config)
    assert "train.seed" not in read and not identity.is_runtime_field("train.seed")
    assert "parallel.fsdp" in read and identity.is_runtime_field("parallel.fsdp")
