"""Failures of the machine, not of the input: a full disk, a file-size or quota
limit, a read-only filesystem.  One line naming the file and the system's
reason, like bad input, but with their own exit status (:data:`EXIT_STORAGE`):
re-running after freeing space resumes, no other command is needed."""

from __future__ import annotations

import errno
import os
import re

from depthbench.errors import EXIT_STORAGE

__all__ = ["EXIT_STORAGE", "StorageError", "is_storage_error", "os_error_code", "storage_error"]

# The errors a full or read-only disk produces (EFBIG: RLIMIT_FSIZE or the
# filesystem's largest file; EDQUOT: a quota).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS})

_TENSORSTORE_CODE = re.compile(r"os_error_code='(\d+)'")


class StorageError(OSError):
    """A write failed for lack of space (or a read-only disk); ``str()`` is one line:
    what failed, the reason, and what to do (``hint``)."""

    def __init__(self, code: int, what: str, hint: str):
        super().__init__(code, what)
        self.what, self.hint = what, hint

    def __str__(self) -> str:
        return f"{self.what} ({os.strerror(self.errno)}); {self.hint}"


def os_error_code(e: BaseException) -> int | None:
    """The errno behind ``e``: an OSError's own, or one quoted by a wrapped
    TensorStore error (Orbax's writes raise ``ValueError`` with the code in text,
    ``os_error_code='28'``, or only the reason: ``RESOURCE_EXHAUSTED: ... No space
    left on device``)."""
    for err in (e, e.__cause__, e.__context__):
        if isinstance(err, OSError) and err.errno:
            return err.errno
        if err is not None:
            text = str(err)
            match = _TENSORSTORE_CODE.search(text)
            if match:
                return int(match.group(1))
            for code in STORAGE_ERRNOS:
                if os.strerror(code) in text:
                    return code
    return None


def is_storage_error(e: BaseException) -> bool:
    return os_error_code(e) in STORAGE_ERRNOS


def retry_hint(e: BaseException) -> str:
    """What to do about a full or a read-only disk, by the error's code."""
    if os_error_code(e) == errno.EROFS:
        return "make it writable and re-run the same command"
    return "free space and re-run the same command"


def storage_error(e: BaseException, what: str | None, hint: str) -> StorageError:
    """``what`` (e.g. "metrics: could not write /x/metrics.jsonl") + the reason + ``hint``.
    ``what`` None: the one ``e`` already says (a StorageError's), else the file it names."""
    code = os_error_code(e) or errno.EIO
    if what is None:
        filename = getattr(e, "filename", None)
        what = getattr(e, "what", None) or f"could not write {filename or 'a file'}"
    return StorageError(code, what, hint)
