"""The coordinate check (in-process, but it trains models, hence integration):
the slope fit's known answers, CompleteP against pre_ln at init, and
invariants of the measured streams.

Tiny models on a pre-tokenised shard of arithmetic progressions (no network,
no tokenizer)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from toy_corpus import write_progressions

from depthbench import config as config_lib
from depthbench.analysis import coordcheck
from depthbench.config import ConfigError


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_progressions(root / "shard.npy", 400)
    return config_lib.load(config_lib.base_spec_path(), [
        "model.vocab_size=64", "model.remat_policy=none", "data.corpus=tokens",
        f"data.paths={root / 'shard.npy'}", "data.eos_id=0", "data.val_fraction=0.1",
        "data.val_windows=4", f"data.cache_dir={root / 'cache'}", "train.batch_size=4",
        "train.seq_len=64", "train.lr=1e-2"])


def test_loglog_slope_known_answers():
    x = [2, 4, 8, 2, 4, 8]
    groups = [64, 64, 64, 128, 128, 128]
    # y = c_g x^0.5 with a different c per group: the grouped fit sees only the slope.
    y = [c * v ** 0.5 for c, v in zip([1, 1, 1, 7, 7, 7], x, strict=True)]
    assert coordcheck.loglog_slope(x, y, groups) == pytest.approx(0.5, abs=1e-12)
    # A pooled fit would be fooled by the intercepts; the grouped one is not.
    y2 = [1.0, 1.0, 1.0, 9.0, 9.0, 9.0]
    assert coordcheck.loglog_slope([2, 4, 8, 16, 32, 64], y2, [0, 0, 0, 1, 1, 1]) == \
        pytest.approx(0.0, abs=1e-12)
    assert coordcheck.loglog_slope(x, [v ** -1.0 for v in x], [0] * 6) == pytest.approx(-1.0)
    # Nothing to fit: one x per group, or a size that is zero.
    assert coordcheck.loglog_slope([2, 4], [1.0, 2.0], [0, 1]) is None
    assert coordcheck.loglog_slope([2, 4], [0.0, 2.0], [0, 0]) is None


@pytest.mark.slow  # models built and trained at several depths
def test_completep_depth_slope_at_init_is_flatter_than_pre_ln(base):
    """pre_ln's stream grows with depth at init; CompleteP's 1/L branch scale
    keeps it flatter (the issue's known answer)."""
    check = coordcheck.run(base, ["pre_ln", "completep"], [2, 4, 8], [64], steps=0, heads=2)
    slopes = check.slopes()
    pre, cp = slopes["pre_ln"]["depth_slope"], slopes["completep"]["depth_slope"]
    assert pre > 0.3  # grows with depth: about sqrt(L) or faster
    assert abs(cp) < abs(pre)
    assert slopes["pre_ln"]["width_slope"] is None  # one width: nothing to fit
    assert slopes["completep"]["lr_rule"] == "family"  # its own rule under --lr-rule auto
    assert slopes["pre_ln"]["lr_rule"] == "none"
    for p in check.points:
        assert p.state_rms.shape == (1, p.depth + 1)
        assert np.all(p.delta_rms == 0.0)  # nothing moved before any update
    # The embedding (z_0) does not depend on the depth or the family at one width and seed.
    z0 = {float(p.state_rms[0][0]) for p in check.points}
    assert len(z0) == 1


@pytest.mark.slow  # models built and trained at several depths
def test_completep_at_its_base_depth_is_pre_ln_step_for_step(base):
    """At L = L_base the branch multiplier, the block learning-rate factor and
    the epsilon factor are all 1: the two models are the same, trained or not."""
    check = coordcheck.run(base, ["pre_ln", "completep"], [4], [32, 64], steps=2, heads=2)
    by = {(p.family, p.width): p for p in check.points}
    for width in (32, 64):
        a, b = by["pre_ln", width], by["completep", width]
        np.testing.assert_allclose(a.state_rms, b.state_rms, rtol=1e-6)
        np.testing.assert_allclose(a.delta_rms, b.delta_rms, rtol=1e-6)
        assert a.losses == pytest.approx(b.losses, rel=1e-6)
        assert np.all(a.delta_rms[1:, -1] > 0)  # training moved the final state
        assert a.state_rms.shape == (3, 5)
    assert check.slopes()["pre_ln"]["depth_slope"] is None  # one depth
    record = check.as_dict()
    assert set(record["families"]) == {"pre_ln", "completep"}
    assert [s["step"] for s in record["families"]["pre_ln"]["by_step"]] == [0, 1, 2]
    assert record["families"]["pre_ln"]["width_slope"] == pytest.approx(
        record["families"]["completep"]["width_slope"], rel=1e-5)
    # Read back (as --json writes it), whole or one family: the same numbers.
    again = coordcheck.CoordCheck.from_dict(json.loads(json.dumps(record)))
    assert again.slopes() == check.slopes()
    only = coordcheck.CoordCheck.from_dict(record, ["completep"])
    assert only.families() == ["completep"] and only.settings["families"] == ["completep"]
    np.testing.assert_array_equal(only.points[0].state_rms, by["completep", 32].state_rms)


def test_bad_grids_are_one_line_errors(base):
    with pytest.raises(ConfigError, match="--families"):
        coordcheck.run(base, ["nope"], [2, 4], [32], steps=0, heads=2)
    with pytest.raises(ConfigError, match="--widths"):
        coordcheck.run(base, ["pre_ln"], [2, 4], [30], steps=0, heads=2)  # odd head_dim
    with pytest.raises(ConfigError, match="two depths or two widths"):
        coordcheck.run(base, ["pre_ln"], [2], [32], steps=0, heads=2)
    with pytest.raises(ConfigError, match="--steps"):
        coordcheck.run(base, ["pre_ln"], [2, 4], [32], steps=-1, heads=2)
    with pytest.raises(ConfigError, match="--lr-rule"):
        coordcheck.lr_rule_for("pre_ln", "sometimes")
