"""depthbench.hostmem: by default nothing is changed and nothing re-executed
(the command and ``main()`` run alike); asked for, a large buffer freed and
allocated again (XLA:CPU's temp buffer, every step) is not page-faulted in
again, with mimalloc (the command re-executes itself with it preloaded) or
with glibc keeping freed memory (``keep``).

Each case runs in a fresh interpreter: an allocator is chosen when a process
starts, glibc's settings must be made before any thread takes a malloc arena,
and both last for the process."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
from paths import REPO

from depthbench import hostmem
from depthbench.errors import ConfigError

glibc_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc malloc's")

# Three rounds of malloc, touch every page, free, on a fresh thread (XLA's
# worker threads allocate the temp buffer); prints the decision, then each
# round's minor page faults.  With "command" as its argument it starts as a
# command does (hostmem.apply_or_exit, which may re-execute it), and prints its
# pid, then what a process it starts finds in $LD_PRELOAD, on a third line.
_ROUNDS = r"""
import ctypes, os, resource, subprocess, sys, threading
from depthbench import hostmem
command = sys.argv[1:] == ["command"]
print(hostmem.apply_or_exit("t") if command else
      hostmem.apply(sys.argv[1] if len(sys.argv) > 1 else None))
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
if command:
    child = subprocess.run(["sh", "-c", "echo \"[$LD_PRELOAD]\""], capture_output=True, text=True)
    print(os.getpid(), child.stdout.strip())
"""

# The environment as a user starts a command: none of the variables this
# module reads or sets.
_CLEAN = {k: v for k, v in os.environ.items()
          if k not in ("DEPTHBENCH_MALLOC", "DEPTHBENCH_MALLOC_REEXEC", "LD_PRELOAD",
                       "JAX_PLATFORMS") and not k.startswith("MIMALLOC_")}


def _run_rounds(*args: str, **env: str) -> tuple[list[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", _ROUNDS, *args], env={**_CLEAN, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    return out.splitlines(), proc.pid


def _rounds(*args: str, **env: str) -> tuple[str, bool, list[int]]:
    out, _ = _run_rounds(*args, **env)
    light, *faults = out[1].split()
    return out[0], light == "True", [int(f) for f in faults]


MIMALLOC_STATUS = ("mimalloc (MIMALLOC_ALLOW_THP=0, MIMALLOC_ARENA_EAGER_COMMIT=1, "
                   "MIMALLOC_PURGE_DELAY=-1)")
needs_mimalloc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or hostmem.mimalloc_library() is None,
    reason="mimalloc is a dependency on Linux")


@glibc_linux
def test_by_default_a_command_is_not_re_executed_and_runs_as_main_does():
    out, pid = _run_rounds("command")  # the default, as the depthbench command starts
    assert out[0] == "system default"
    assert out[2].split() == [str(pid), "[]"]  # not re-executed; nothing preloaded
    faults = [int(f) for f in out[1].split()[1:]]
    assert min(faults[1:]) > 1000, faults  # glibc unmaps the freed buffer: faulted again
    # main() in a Python process, as a notebook or a test calls it: the same decision.
    code = ("import sys\nfrom depthbench import hostmem\nfrom depthbench.cli import main\n"
            "code = main(['shapes', '--suite', 'micro'])\n"
            "print(hostmem.status(), code, sep='|', file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], env=_CLEAN, capture_output=True,
                          text=True)
    assert done.stderr.strip().splitlines()[-1] == "system default|0", done.stderr


@needs_mimalloc
def test_asked_for_mimalloc_a_command_re_executes_itself_once_and_its_children_start_clean():
    out, pid = _run_rounds("command", DEPTHBENCH_MALLOC="mimalloc")
    assert out[0] == MIMALLOC_STATUS
    faults = [int(f) for f in out[1].split()[1:]]
    assert faults[0] >= 64  # the first touch faults (4 KiB pages: 65,536; 2 MiB ones: 128)
    assert max(faults[1:]) <= 16, faults  # the freed memory is reused
    # The same process (exec in place, not a child); what it starts has no preload.
    assert out[2].split() == [str(pid), "[]"]
    plain, _, system = _rounds("system")
    assert plain == "system default"
    assert min(system[1:]) > 10 * max(faults[1:]), system  # glibc: unmapped, faulted again


@needs_mimalloc
def test_no_re_execution_unless_mimalloc_is_asked_for_and_free_to_load():
    for env, decided in (
        ({"DEPTHBENCH_MALLOC": "system"}, "system default"),
        ({"DEPTHBENCH_MALLOC": "keep"}, "freed memory kept (one arena, no mmap, no trim)"),
        # the user's own preload wins (a library that exists, loaded harmlessly)
        ({"DEPTHBENCH_MALLOC": "mimalloc", "LD_PRELOAD": "libm.so.6"},
         "system default (LD_PRELOAD is set: libm.so.6)"),
    ):
        out, pid = _run_rounds("command", **env)
        assert out[0] == decided, env
        assert out[2].split()[0] == str(pid)
    # apply(), as a notebook calls it, never re-executes: it says what would.
    assert _rounds("mimalloc")[0] == (
        "system default (mimalloc is loaded at process start: the depthbench command and "
        "python -m bench do it)")
    # A mimalloc setting of the user's wins (and is theirs: it stays in the environment).
    out, _ = _run_rounds("command", DEPTHBENCH_MALLOC="mimalloc", MIMALLOC_PURGE_DELAY="100")
    assert out[0] == MIMALLOC_STATUS.replace("PURGE_DELAY=-1", "PURGE_DELAY=100")
    # Preloaded by hand, it is what every setting reports (the default included).
    out, pid = _run_rounds("command", LD_PRELOAD=hostmem.mimalloc_library())
    assert out[0] == "mimalloc (its defaults)" and out[2].split()[0] == str(pid)


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
def test_keep_only_when_asked_for():
    assert not _rounds()[0].startswith("freed memory kept")
    assert _rounds(DEPTHBENCH_MALLOC="keep")[0].startswith("freed memory kept")
    assert _rounds(DEPTHBENCH_MALLOC="system")[0] == "system default"


def test_bad_setting_is_one_line_and_exit_2(tmp_path):
    with pytest.raises(ConfigError, match=r"\$DEPTHBENCH_MALLOC: 'always' is not one of "
                                          r"system, mimalloc, keep"):
        hostmem.setting("always")
    env = {**os.environ, "DEPTHBENCH_MALLOC": "always"}
    for command in ([sys.executable, "-m", "depthbench", "shapes"],
                    [sys.executable, "-m", "bench.peer", "--quick"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              cwd=REPO)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().count("\n") == 0
        assert ("$DEPTHBENCH_MALLOC: 'always' is not one of system, mimalloc, keep"
                in done.stderr)
    # main() called from Python says the same, one line, exit status 2.
    code = "import sys\nfrom depthbench.cli import main\nsys.exit(main(['shapes']))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr == (
        "depthbench: error: $DEPTHBENCH_MALLOC: 'always' is not one of system, mimalloc, keep\n")


@glibc_linux
def test_a_late_call_says_it_is_late():
    code = ("import numpy\nfrom depthbench import hostmem\n"
            "print(hostmem.apply('keep'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ("freed memory kept (one arena, no mmap, no trim); set after numpy was "
                   "imported: their threads' arenas may still map and unmap")
