"""Weights & Biases as a second metrics sink (offline, no network; W&B starts its own
service process; the setting's checks: tests/unit/test_wandb_sink_setting.py).

A one-run sweep trains a tiny model with ``train.wandb=offline``; the test
reads back the records W&B wrote (its ``.wandb`` file: the LevelDB log
format, each record a ``wandb_internal_pb2.Record``) and checks the config,
the group (the sweep directory's name) and logged values against the run's
own ``metrics.jsonl``, ``layer_stats.jsonl`` and ``result.json``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from toy_corpus import tiny_run_overrides

from depthbench import sweep as sweeplib
from depthbench.rundir.io import read_jsonl
from depthbench.train import wandb_sink

STEPS, EVERY = 8, 4
SPEC = """
from depthbench.config import base_config


def get_config():
    return base_config()


def get_sweep():
    return [{"train.lr": 1e-2}]
"""


@pytest.fixture()
def overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tiny_run_overrides(tmp_path, STEPS, EVERY)


def wandb_records(path: Path) -> list:
    """Every record of a ``.wandb`` file: a 7-byte header, then the LevelDB log
    format (32 KiB blocks; each chunk a 7-byte header -- crc32, length, type --
    and its bytes; types 1 FULL, 2 FIRST, 3 MIDDLE, 4 LAST)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, chunk, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:  # a block's tail too short for a chunk header is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def _history(records) -> dict[int, dict[str, float]]:
    """{step: {name: value}} of the history records."""
    out: dict[int, dict[str, float]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = out.setdefault(r.history.step.num, {})
            for item in r.history.item:
                row[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def test_a_sweep_run_logs_its_config_metrics_and_block_stats_to_wandb(overrides, tmp_path):
    pytest.importorskip("wandb", reason="needs the wandb extra (pip install -e '.[wandb]')")
    spec = tmp_path / "wandb_sweep.py"
    spec.write_text(SPEC)
    given = [o for o in overrides if not o.startswith("train.lr=")]  # the sweep's field
    sweep = sweeplib.expand(spec, [*given, "train.wandb=offline"])
    workdir = tmp_path / "my_sweep"
    outcome = sweeplib.run_sweep(sweep, workdir, progress=False)
    (name,) = outcome.trained
    run_dir = workdir / name
    (path,) = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    records = wandb_records(path)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    saved = json.loads((run_dir / "config.json").read_text())
    assert run.run_group == "my_sweep" and run.display_name == name
    assert run.run_id == wandb_sink.run_id(run_dir.resolve(), saved)
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert {"model", "data", "train", "resolved"} <= set(config)
    assert config["train"]["wandb"] == "offline" and config["train"]["lr"] == 1e-2
    result = json.loads((run_dir / "result.json").read_text())
    assert config["resolved"]["flops_per_token"] == result["flops_per_token"]
    history = _history(records)
    # Every metrics.jsonl row, under TensorBoard's names, at its step.
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        assert history[row["step"]]["train/loss"] == row["loss"]
        assert history[row["step"]]["train/grad_norm"] == row["grad_norm"]
    assert history[STEPS]["eval/val_loss"] == result["final_val_loss"]
    stats = read_jsonl(run_dir / "layer_stats.jsonl")
    assert [r["step"] for r in stats] == [EVERY, STEPS]
    for row in stats:
        for stat in ("state_rms", "update_rms", "forward_norm", "backward_norm"):
            values = row[stat]
            assert len(values) >= 2
            for i, v in enumerate(values):
                assert history[row["step"]][f"layers/{stat}/{i:03d}"] == v


