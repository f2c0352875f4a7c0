"""No test writes into the checkout: the snapshot comparison (tests/helpers/checkout_guard.py)
and the session that fails on it, run in-process on a small pytest session."""

from __future__ import annotations

from checkout_guard import CheckoutGuard, created, snapshot


def test_created_names_new_paths_once_and_leaves_out_caches(tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "mod.py").write_text("")
    (tmp_path / ".git").mkdir()
    before = snapshot(tmp_path)
    assert before == {"src", "src/pkg", "src/pkg/mod.py"}
    (tmp_path / "build" / "lib" / "pkg").mkdir(parents=True)  # a new tree: named once
    (tmp_path / "build" / "lib" / "pkg" / "mod.py").write_text("")
    (tmp_path / "src" / "pkg" / "new.txt").write_text("")
    for cache in ("src/pkg/__pycache__", ".pytest_cache", "src/pkg.egg-info", ".venv/bin",
                  ".git/objects"):
        (tmp_path / cache).mkdir(parents=True)
        (tmp_path / cache / "x").write_text("")
    session_tmp = tmp_path / "basetemp"
    (session_tmp / "test_0").mkdir(parents=True)
    after = snapshot(tmp_path, skip=session_tmp)
    assert created(before, after) == ["build", "src/pkg/new.txt"]
    assert created(after, after) == []


_WRITES = """
from pathlib import Path

def test_writes_under_tmp_path(tmp_path):
    (tmp_path / "fine.txt").write_text("x")

def test_writes_into_the_checkout():
    Path(__file__).with_name("left_behind").mkdir()
    (Path(__file__).with_name("left_behind") / "a.txt").write_text("x")
"""


def test_a_session_that_leaves_files_in_the_checkout_fails_naming_them(pytester):
    pytester.makepyfile(test_inner=_WRITES)
    clean = pytester.runpytest_inprocess("-k", "tmp_path", plugins=[CheckoutGuard(pytester.path)])
    assert clean.ret == 0
    clean.assert_outcomes(passed=1, deselected=1)
    dirty = pytester.runpytest_inprocess(plugins=[CheckoutGuard(pytester.path)])
    dirty.assert_outcomes(passed=2)  # every test passed, and still the session fails
    assert dirty.ret == 1
    dirty.stdout.fnmatch_lines([f"FAILED: the tests left 1 new path(s) in the checkout "
                                f"{pytester.path}: left_behind; *"])
