"""The suite's compilation-cache folder (tests/helpers/xla_cache.py): where it is, per CPU,
and how it is cut back."""

from __future__ import annotations

import os

import xla_cache


def _entry(folder, name, size, mtime):
    path = folder / name
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime, mtime))
    return path


def test_prune_removes_the_oldest_entries_down_to_keep(tmp_path):
    paths = [_entry(tmp_path, f"k{i}-cache", 100, 1_000 + i) for i in range(10)]  # 1,000 bytes
    assert xla_cache.prune(tmp_path, limit=1_000, keep=300) == 0  # at the limit: untouched
    assert all(p.exists() for p in paths)
    assert xla_cache.prune(tmp_path, limit=999, keep=300) == 7
    assert [p.exists() for p in paths] == [False] * 7 + [True] * 3  # the three newest stay


def test_prune_orders_by_modification_time_not_name(tmp_path):
    old = _entry(tmp_path, "b-cache", 600, 10)
    new = _entry(tmp_path, "a-cache", 600, 20)
    assert xla_cache.prune(tmp_path, limit=1_000, keep=600) == 1
    assert not old.exists() and new.exists()


def test_cache_dir_is_under_the_data_cache_root_per_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHBENCH_CACHE", str(tmp_path / "root"))
    folder = xla_cache.cache_dir()
    tag = xla_cache.cpu_tag()
    assert folder == tmp_path / "root" / "xla-tests" / tag and folder.is_dir()
    assert len(tag) == 12 and int(tag, 16) >= 0
    assert xla_cache.cpu_tag() == tag  # the same host, the same folder


def test_a_cut_short_entry_is_dropped_and_only_new_entries_are_read(tmp_path):
    import zlib

    whole = zlib.compress(b"an executable" * 100)
    good = tmp_path / "jit_f-1-cache"
    good.write_bytes(whole)
    cut = tmp_path / "jit_g-2-cache"
    cut.write_bytes(whole[: len(whole) // 2])  # a writer killed mid-write
    reads = []

    def decompress(data):
        reads.append(len(data))
        return zlib.decompress(data)

    assert xla_cache.drop_unreadable(tmp_path, decompress) == ["jit_g-2-cache"]
    assert good.exists() and not cut.exists() and len(reads) == 2
    # The next session reads only what was written after this check.
    os.utime(good, (500, 500))  # written before the check ...
    os.utime(tmp_path / xla_cache.CHECKED, (1_000, 1_000))
    reads.clear()
    newer = tmp_path / "jit_h-3-cache"
    newer.write_bytes(whole[:-4])
    assert xla_cache.drop_unreadable(tmp_path, decompress) == ["jit_h-3-cache"]
    assert reads == [len(whole) - 4] and good.exists()
