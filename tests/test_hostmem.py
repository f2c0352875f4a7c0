"""depthbench.hostmem: glibc keeps freed memory, so a large buffer freed and
allocated again (XLA:CPU's temp buffer, every step) is not page-faulted in again.

Each case runs in a fresh interpreter: the settings must be made before any
thread takes a malloc arena, and they last for the process."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from depthbench import hostmem
from depthbench.errors import ConfigError

glibc_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc malloc's")

# Three rounds of malloc, touch every page, free, on a fresh thread (XLA's
# worker threads allocate the temp buffer); prints the decision, then each
# round's minor page faults.
_ROUNDS = r"""
import ctypes, resource, sys, threading
from depthbench import hostmem
print(hostmem.keep_freed_memory(sys.argv[1] if len(sys.argv) > 1 else None))
light = not any(m in sys.modules for m in ("jax", "numpy"))
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size, faults = 256 << 20, []
def rounds():
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        libc.free(p)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
thread = threading.Thread(target=rounds)
thread.start()
thread.join()
print(light, *faults)
"""


def _rounds(*args: str, **env: str) -> tuple[str, bool, list[int]]:
    clean = {k: v for k, v in os.environ.items() if k != "DEPTHBENCH_MALLOC"}
    out = subprocess.run([sys.executable, "-c", _ROUNDS, *args], env={**clean, **env},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    light, *faults = out[1].split()
    return out[0], light == "True", [int(f) for f in faults]


@glibc_linux
def test_kept_memory_is_not_faulted_in_again_and_system_default_is():
    kept, light, faults = _rounds("keep")
    assert kept.startswith("freed memory kept") and light  # no jax or numpy imported
    assert faults[0] >= 64  # the first touch faults (4 KiB pages: 65,536; 2 MiB ones: 128)
    assert max(faults[1:]) <= 16, faults  # the freed pages are reused
    default, _, system = _rounds("system")
    assert default == "system default"
    assert min(system[1:]) > 10 * max(faults[1:]), system  # unmapped on free, faulted again


@glibc_linux
def test_off_unless_asked_for():
    assert _rounds()[0] == "system default"
    assert _rounds(DEPTHBENCH_MALLOC="keep")[0].startswith("freed memory kept")
    assert _rounds(DEPTHBENCH_MALLOC="system")[0] == "system default"


def test_bad_setting_is_one_line_and_exit_2(tmp_path):
    with pytest.raises(ConfigError, match=r"\$DEPTHBENCH_MALLOC: 'always' is not one of "
                                          r"system, keep"):
        hostmem.keep_freed_memory("always")
    env = {**os.environ, "DEPTHBENCH_MALLOC": "always"}
    for command in ([sys.executable, "-m", "depthbench", "shapes"],
                    [sys.executable, "-m", "bench.peer", "--quick"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.dirname(__file__)))
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().count("\n") == 0
        assert "$DEPTHBENCH_MALLOC: 'always' is not one of system, keep" in done.stderr


@glibc_linux
def test_a_late_call_says_it_is_late():
    code = ("import numpy\nfrom depthbench import hostmem\n"
            "print(hostmem.keep_freed_memory('keep'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ("freed memory kept (one arena, no mmap, no trim); set after numpy was "
                   "imported: their threads' arenas may still map and unmap")
