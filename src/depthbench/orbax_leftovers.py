"""What Orbax leaves behind when a read or a write fails, kept quiet.

A command that fails says why in one line (a damaged step it skips, a full
disk, bad input).  Orbax's asynchronous work, abandoned at the failure,
reports the same failure again later, from background threads or the garbage
collector, at a time no one controls (in a trainer some steps later; in a
test suite, inside another test):

- a TensorStore read or write finishing after Orbax closed the event loop
  that issued it reports ``RuntimeError('Event loop is closed')`` through
  ``sys.unraisablehook``, seven lines of traceback each;
- when one array's read fails, Orbax's gather raises the first error and
  drops the other reads: coroutines closed mid-read raise Orbax's
  ``Encountered error while reading array index ...`` (reported through
  ``sys.unraisablehook``), and futures and tasks whose TensorStore error no
  one retrieved log asyncio's "... exception was never retrieved", each with
  a TensorStore spec: hundreds of lines for one damaged checkpoint.

:func:`quiet_orbax_leftovers` drops exactly these (a TensorStore failure is
recognised by the status code TensorStore's errors begin with, or by Orbax's
own wrapper of a failed read); anything else still reaches the previous hook
or the logger.  Every Orbax reader and writer calls it.
"""

from __future__ import annotations

import inspect
import logging
import re
import sys
from collections.abc import Callable
from typing import Any

_MARK = "_drops_orbax_leftovers"  # set on a hook made by drop_leftover_reports

# TensorStore's errors are ValueErrors whose text starts with an absl status code.
_TENSORSTORE_STATUS = re.compile(
    r"^(CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|"
    r"PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE|"
    r"UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED): ")
_ORBAX_READ_FAILED = "Encountered error while reading array index"  # Orbax's wrapper


def is_tensorstore_failure(e: BaseException | None) -> bool:
    """``e`` (or what it wraps) is a failed TensorStore read or write."""
    seen = 0
    while e is not None and seen < 8:
        text = str(e)
        if _TENSORSTORE_STATUS.match(text) or text.startswith(_ORBAX_READ_FAILED):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def underlying(e: BaseException) -> BaseException:
    """The error to report for ``e``: what Orbax's wrapper of a failed read was
    raised from (TensorStore's own message: which array, which file, what is
    wrong), not the wrapper, whose text is the array's index and a printed
    TensorStore spec; any other error is itself."""
    if str(e).startswith(_ORBAX_READ_FAILED) and e.__cause__ is not None:
        return e.__cause__
    return e


def is_leftover_report(unraisable: Any) -> bool:
    """An unraisable report of abandoned Orbax work: I/O finishing after its event
    loop was closed, or a read coroutine closed mid-read."""
    e = unraisable.exc_value
    if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
        return True
    return inspect.iscoroutine(unraisable.object) and is_tensorstore_failure(e)


def drop_leftover_reports(previous: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A ``sys.unraisablehook`` that drops :func:`is_leftover_report` reports and
    passes anything else to ``previous``."""

    def hook(unraisable: Any) -> None:
        if not is_leftover_report(unraisable):
            previous(unraisable)

    setattr(hook, _MARK, True)
    return hook


class _NeverRetrieved(logging.Filter):
    """asyncio's report of a future or task whose TensorStore error no one retrieved."""

    def filter(self, record: logging.LogRecord) -> bool:
        e = record.exc_info[1] if record.exc_info else None
        return not ("exception was never retrieved" in record.getMessage()
                    and is_tensorstore_failure(e))


_NEVER_RETRIEVED = _NeverRetrieved()


def quiet_orbax_leftovers() -> None:
    """Drop abandoned Orbax work's reports from now on, in this process.

    The hook is checked in place, not against a flag: whoever replaces
    ``sys.unraisablehook`` later (a test runner, a notebook) gets it wrapped at
    the next call; a hook already wrapped is left as it is."""
    if not getattr(sys.unraisablehook, _MARK, False):
        sys.unraisablehook = drop_leftover_reports(sys.unraisablehook)
    asyncio_logger = logging.getLogger("asyncio")
    if _NEVER_RETRIEVED not in asyncio_logger.filters:
        asyncio_logger.addFilter(_NEVER_RETRIEVED)
