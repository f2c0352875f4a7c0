"""The unit tier's rule, checked from inside the tier: every way of starting a
process fails here with a message that names what was started and where the
test belongs (tests/unit/conftest.py, tests/helpers/process_guard.py)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest
from process_guard import ProcessStarted, guarded


def _noop():
    pass


@pytest.mark.parametrize("start, what", [
    (lambda: subprocess.run(["echo", "hi"], check=True), "subprocess echo hi"),
    (lambda: subprocess.check_output("echo hi", shell=True), "subprocess echo hi"),
    (lambda: os.popen("echo hi").read(), "subprocess echo hi"),
    (lambda: os.system("echo hi"), "os.system('echo hi', ...)"),
    # Were the guard broken, the forked child would leave at once, and the
    # exec'd process would end this one with status 3: never a silent pass.
    (lambda: os.fork() or os._exit(0), "os.fork()"),
    (lambda: os.posix_spawn("/bin/true", ["true"], dict(os.environ)), "os.posix_spawn("),
    (lambda: os.execv(sys.executable, [sys.executable, "-c", "raise SystemExit(3)"]),
     "os.execv("),
    (lambda: os.execl(sys.executable, sys.executable, "-c", "raise SystemExit(3)"), "os.execv("),
    (lambda: multiprocessing.get_context("spawn").Process(target=_noop).start(),
     "_posixsubprocess.fork_exec"),
    (lambda: multiprocessing.get_context("fork").Process(target=_noop).start(), "os.fork()"),
], ids=["run", "shell", "popen", "system", "fork", "posix_spawn", "execv", "execl",
        "mp_spawn", "mp_fork"])
def test_a_unit_test_cannot_start_a_process(start, what):
    with pytest.raises(ProcessStarted) as caught:
        start()
    message = str(caught.value)
    assert what in message and "move it to tests/integration" in message, message


def test_guarded_sees_each_start_first_and_puts_everything_back():
    originals = (subprocess.Popen._execute_child, os.fork, os.execve, os.system)
    seen: list[str] = []
    with guarded(seen.append):
        assert os.fork is not originals[1]
        # The recorder lets the start go on, to the tier's own guard around it.
        with pytest.raises(ProcessStarted):
            subprocess.run([sys.executable, "-c", "pass"])
        with pytest.raises(ProcessStarted):
            os.fork() or os._exit(0)
    assert seen == [f"subprocess {sys.executable} -c pass", "os.fork()"]
    assert (subprocess.Popen._execute_child, os.fork, os.execve, os.system) == originals
