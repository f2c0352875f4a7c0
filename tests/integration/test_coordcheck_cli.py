"""`depthbench coordcheck` end to end (integration: the command line): the JSON
file's fields, the figure, and bad input that leaves nothing behind."""

from __future__ import annotations

import json

import pytest
from toy_corpus import write_progressions

from depthbench import config as config_lib
from depthbench.cli import main


@pytest.fixture(scope="module")
def overrides(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_progressions(root / "shard.npy", 400)
    return ["--config", str(config_lib.base_spec_path()), "--heads", "2",
            "--config.model.vocab_size=64", "--config.model.remat_policy=none",
            "--config.data.corpus=tokens", f"--config.data.paths={root / 'shard.npy'}",
            "--config.data.eos_id=0", "--config.data.val_fraction=0.1",
            "--config.data.val_windows=4", f"--config.data.cache_dir={root / 'cache'}",
            "--config.train.batch_size=4", "--config.train.seq_len=32"]


@pytest.mark.slow  # 8 models trained and measured
def test_coordcheck_writes_slopes_json_and_figure(overrides, tmp_path, capsys):
    out, png = tmp_path / "cc.json", tmp_path / "cc.png"
    rc = main(["coordcheck", "--families", "pre_ln,hc+sum_then_norm", "--depths", "2,4",
               "--widths", "32,64", "--steps", "2", "--json", str(out), "--out", str(png),
               "--quiet", *overrides])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "depth slope" in printed and "hc+sum_then_norm" in printed
    record = json.loads(out.read_text())
    assert set(record["families"]) == {"pre_ln", "hc+sum_then_norm"}
    for family, slopes in record["families"].items():
        for key in ("depth_slope", "width_slope", "delta_depth_slope", "delta_width_slope"):
            assert isinstance(slopes[key], float), (family, key)
        assert slopes["lr_rule"] == "none"
        # The headline slopes are those of the last step.
        assert slopes["by_step"][-1]["depth_slope"] == pytest.approx(slopes["depth_slope"])
    points = record["points"]
    assert len(points) == 2 * 2 * 2
    for p in points:
        assert len(p["state_rms"]) == 3 and len(p["state_rms"][0]) == p["depth"] + 1
        assert len(p["losses"]) == 2
    assert record["settings"]["depths"] == [2, 4] and record["settings"]["steps"] == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, field", [
    (["--families", "pre_ln,nope"], "--families"),
    (["--depths", "2,x"], "--depths"),
    (["--widths", "33,64"], "--widths"),
    (["--json", "/no/such/dir/cc.json"], "--json"),
    (["--steps", "-2"], "--steps"),
])
def test_bad_input_is_one_line_and_writes_nothing(overrides, tmp_path, capsys, args, field):
    png = tmp_path / "cc.png"
    rc = main(["coordcheck", "--depths", "2,4", "--widths", "32", "--out", str(png),
               *overrides, *args])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"depthbench: error: {field}")
    assert list(tmp_path.iterdir()) == []
