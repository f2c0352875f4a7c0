"""Bad input and exit statuses: what every module raises and every command returns.
Imports nothing from the package, so it sits below everything."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # a sweep in which a run failed (its traceback is in the run's failure.txt)
EXIT_BAD_INPUT = 2  # one line on stderr naming the field / file / flag and what is allowed
EXIT_DIVERGED = 3  # training diverged (result.json records the step)
EXIT_STORAGE = 4  # disk full or read-only (one line on stderr; free space and re-run: it resumes)


class ConfigError(ValueError):
    """A bad spec, override, flag or field value: one line, naming the field."""
