"""Orbax's abandoned work after a failure reports nothing; any other report
still shows (depthbench.orbax_leftovers)."""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import sys

import pytest

from depthbench.orbax_leftovers import (
    drop_leftover_reports,
    is_tensorstore_failure,
    quiet_orbax_leftovers,
    underlying,
)

Unraisable = collections.namedtuple("Unraisable", "exc_value object", defaults=[None])
READ_ERROR = ('OUT_OF_RANGE: Error reading "params.blocks.mlp.gate/0.0.0" in OCDBT database '
              'at local file "/run/checkpoints/4/state/": Requested byte range [89264, 104128) '
              "is not valid for value of size 58598")
ORBAX_CLOSED = "Encountered error while reading array index: (slice(0, 2, 1),). See full ..."


def _orbax_wrapped(cause: BaseException) -> Exception:
    """Orbax's own wrapper of a failed read (serialization.py), raised from ``cause``."""
    try:
        raise Exception("Encountered error while reading array index: (slice(0, 2, 1),). "
                        "See full TensorStore details: {...}.") from cause
    except Exception as e:
        return e


def test_tensorstore_failures_are_told_by_their_status_or_orbax_wrapper():
    assert is_tensorstore_failure(ValueError(READ_ERROR))
    assert is_tensorstore_failure(_orbax_wrapped(GeneratorExit()))
    assert not is_tensorstore_failure(RuntimeError("outer"))
    chained = RuntimeError("outer")
    chained.__cause__ = ValueError("DATA_LOSS: checksum mismatch")
    assert is_tensorstore_failure(chained)
    assert not is_tensorstore_failure(ValueError("out_of_range: lower case is not TensorStore's"))
    assert not is_tensorstore_failure(KeyError("OUT_OF_RANGE: "))  # str() quotes a KeyError
    assert not is_tensorstore_failure(None)


def test_a_failed_read_is_reported_by_tensorstores_message_not_orbaxs_wrapper():
    cause = ValueError(READ_ERROR)
    assert underlying(_orbax_wrapped(cause)) is cause
    alone = Exception("Encountered error while reading array index: (slice(0, 2, 1),).")
    assert underlying(alone) is alone  # nothing underneath: the wrapper itself
    other = RuntimeError("a reader's own failure")
    other.__cause__ = cause
    assert underlying(other) is other


def test_leftover_reports_are_dropped_and_nothing_else():
    seen = []
    hook = drop_leftover_reports(seen.append)

    async def reading():
        return None

    coroutine = reading()
    hook(Unraisable(RuntimeError("Event loop is closed")))
    hook(Unraisable(_orbax_wrapped(GeneratorExit()), coroutine))  # a read closed mid-read
    hook(Unraisable(RuntimeError("something else")))
    hook(Unraisable(ValueError("Event loop is closed")))
    hook(Unraisable(_orbax_wrapped(GeneratorExit()), None))  # not from a coroutine
    hook(Unraisable(ValueError("a coroutine's own failure"), coroutine))
    coroutine.close()
    assert [str(u.exc_value) for u in seen] == [
        "something else", "Event loop is closed",
        str(_orbax_wrapped(GeneratorExit())), "a coroutine's own failure"]


def test_the_hook_is_wrapped_in_place_once(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])
    quiet_orbax_leftovers()
    wrapped = sys.unraisablehook
    quiet_orbax_leftovers()
    assert sys.unraisablehook is wrapped  # not wrapped twice
    assert len(logging.getLogger("asyncio").filters) == 1  # one filter, not two
    sys.unraisablehook(Unraisable(RuntimeError("Event loop is closed")))
    sys.unraisablehook(Unraisable(RuntimeError("kept")))
    assert [str(u.exc_value) for u in seen] == ["kept"]
    sys.unraisablehook = seen.append  # someone replaces it (a test runner): wrapped again
    quiet_orbax_leftovers()
    sys.unraisablehook(Unraisable(RuntimeError("Event loop is closed")))
    assert len(seen) == 1


class _Pending:
    """An awaitable that never completes: a read in flight."""

    def __await__(self):
        yield


def _failed_restore_garbage(error: str, closing_error: str) -> None:
    """What a failed Orbax restore drops, in a reference cycle (only the garbage
    collector frees it): a finished task whose ``error`` no one retrieved, and a
    coroutine suspended mid-read whose close raises ``closing_error``."""
    async def failed_read():
        raise ValueError(error)

    async def read_in_flight():
        try:
            await _Pending()
        except BaseException as e:  # as Orbax's reader does
            raise Exception(closing_error) from e

    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(failed_read())
        loop.run_until_complete(asyncio.wait([task]))
    finally:
        loop.close()
    suspended = read_in_flight()
    suspended.send(None)
    cycle: list = [task, suspended]
    cycle.append(cycle)


@pytest.fixture
def reports(monkeypatch, caplog):
    """What reaches the process's hook (a recorder) and the asyncio logger; the
    asyncio logger (its filters as before, after the test)."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])
    gc.collect()
    caplog.clear()

    def read() -> list[str]:
        got = [f"unraisable {type(u.exc_value).__name__}" for u in seen]
        got += [f"asyncio {r.getMessage().splitlines()[0]}" for r in caplog.records
                if r.name == "asyncio"]
        return sorted(got)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        yield read


def test_without_the_filters_a_failed_restore_reports_again(reports):
    """The problem: collected by the garbage collector, the dropped reads report
    their failure again (hundreds of lines for a real checkpoint)."""
    _failed_restore_garbage(READ_ERROR, ORBAX_CLOSED)
    gc.collect()
    assert reports() == ["asyncio Task exception was never retrieved", "unraisable Exception"]


def test_with_the_filters_only_other_failures_report(reports):
    quiet_orbax_leftovers()
    _failed_restore_garbage(READ_ERROR, ORBAX_CLOSED)
    gc.collect()
    assert reports() == []
    # Not TensorStore's failures: shown.
    _failed_restore_garbage("the program's own failure", "the program's own at close")
    gc.collect()
    assert reports() == ["asyncio Task exception was never retrieved", "unraisable Exception"]
