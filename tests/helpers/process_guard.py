"""Catch every way a test can start a process, so the unit tier stays in-process.

``tests/unit/conftest.py`` runs each unit test inside :func:`forbidding`: a
subprocess, a fork, a ``posix_spawn``, an ``exec`` or a multiprocessing child
then raises :class:`ProcessStarted` naming what was started, instead of
starting it.  The tier's promise (seconds each, in one process, under 3
minutes in all) is kept by the suite itself, not by review.

The patched entry points are the ones every way of starting a process in
CPython goes through: ``subprocess.Popen`` (``run``, ``check_output``,
``os.popen``, asyncio), ``_posixsubprocess.fork_exec`` (multiprocessing's
spawn and forkserver), ``os.fork``/``os.forkpty`` (multiprocessing's fork,
``os.spawn*``, ``pty``), ``os.posix_spawn*``, ``os.system`` and ``os.exec*``
(``os.execl*`` call them), which would replace the test process itself.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator

_OS_CALLS = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system",
             "execv", "execve", "execvp", "execvpe")


class ProcessStarted(RuntimeError):
    """A test tried to start a process where processes are not allowed."""


def _describe(name: str, args: tuple) -> str:
    """What a patched call was about to start, for the message."""
    if name == "Popen":  # Popen._execute_child(self, args, executable, ...)
        command = args[1]
        return "subprocess " + (command if isinstance(command, str)
                                else " ".join(map(str, command)))
    if name == "fork_exec":
        return "a child process (_posixsubprocess.fork_exec: multiprocessing or a spawn helper)"
    if name in ("fork", "forkpty"):
        return f"os.{name}()"
    return f"os.{name}({args[0]!r}, ...)"


@contextlib.contextmanager
def guarded(on_start: Callable[[str], None]) -> Iterator[None]:
    """Within the block, every attempt to start a process first calls
    ``on_start(description)``: raising there stops the process from starting;
    returning lets it start as usual (a recorder)."""
    originals: list[tuple[object, str, object]] = []

    def patch(owner, attr: str, name: str) -> None:
        original = getattr(owner, attr, None)
        if original is None:  # not on this platform
            return

        def checked(*args, **kwargs):
            on_start(_describe(name, args))
            return original(*args, **kwargs)

        originals.append((owner, attr, original))
        setattr(owner, attr, checked)

    patch(subprocess.Popen, "_execute_child", "Popen")
    patch(_posixsubprocess, "fork_exec", "fork_exec")
    for call in _OS_CALLS:
        patch(os, call, call)
    try:
        yield
    finally:
        for owner, attr, original in reversed(originals):
            setattr(owner, attr, original)


def forbidding(reason: str) -> contextlib.AbstractContextManager[None]:
    """Within the block, starting a process raises :class:`ProcessStarted`
    with what was started and ``reason``."""

    def refuse(what: str) -> None:
        raise ProcessStarted(f"this test started a process ({what}); {reason}")

    return guarded(refuse)
