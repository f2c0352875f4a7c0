"""The benchmarks' table header names the environment settings that change step times."""

import sys

from paths import REPO

sys.path.insert(0, str(REPO))  # the repository's bench/

from bench import common  # noqa: E402


def test_header_names_the_step_time_settings_that_are_set(monkeypatch):
    for key in common.STEP_ENV:
        monkeypatch.delenv(key, raising=False)
    bare = common.header("t").splitlines()
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=1")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    tuned = common.header("t").splitlines()
    assert bare[0] == tuned[0] == "== t =="
    assert not any(key in bare[1] for key in common.STEP_ENV)
    assert tuned[1].endswith("; XLA_FLAGS=--xla_cpu_multi_thread_eigen=false"
                             "; GLIBC_TUNABLES=glibc.malloc.arena_max=1")
