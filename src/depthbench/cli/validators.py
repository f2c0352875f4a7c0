"""Option values checked when the command line is parsed (argparse ``type=``):
what is not allowed is the parser's one ``depthbench: error: --option: ...``
line (exit status 2) before anything is loaded or written.  Checks that need
the option's context (a suite's depths, a run's steps) stay with the command."""

from __future__ import annotations

import argparse
from pathlib import Path

from depthbench.output_paths import LOOP, link_loop

__all__ = ["directory", "non_negative_float", "non_negative_int", "plain_name",
           "positive_int", "seed", "unit_fraction"]


def _integer(text: str, lowest: int, what: str, highest: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = lowest - 1
    if value < lowest or (highest is not None and value > highest):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count: 1, 2, ..."""
    return _integer(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """0, 1, 2, ... (a number of shots, a step)."""
    return _integer(text, 0, "an integer >= 0")


def seed(text: str) -> int:
    """A sampling seed: what jax's key takes as given (32 bits; a larger one would
    wrap onto a smaller one's stream, or overflow)."""
    return _integer(text, 0, f"an integer in [0, {2**32 - 1}]", 2**32 - 1)


def _number(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        return float("nan")
    return value


def non_negative_float(text: str) -> float:
    """0 or more (a temperature)."""
    value = _number(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def unit_fraction(text: str) -> float:
    """A number in (0, 1] (a top-p nucleus)."""
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def plain_name(text: str) -> str:
    """A name that becomes one file name inside a run directory: no path
    components, so nothing is written outside it."""
    if not text.strip() or text in (".", "..") or any(c in text for c in "/\\\0"):
        raise argparse.ArgumentTypeError(
            f"expected a name without path components (no '/' or '\\', not '.' or '..'), "
            f"got {text!r}")
    return text


def directory(text: str) -> str:
    """A directory to read or create: absent, or a directory; never a file nor
    a path through one, nor a link loop.  URLs (``gs://...``) pass unchecked: the command says
    whether it takes them."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory, got ''")
    if "://" in text:
        return text
    path = Path(text).expanduser()
    if link_loop(path):
        raise argparse.ArgumentTypeError(f"{text!r} {LOOP}")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not path.exists() and not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {str(parent)!r} is a file, not a "
                                         "directory")
    return text
