"""The padded lengths a model call is compiled for: powers of two from
:data:`MIN_BUCKET`, then the window itself, so a run of many requests compiles
one program per bucket instead of one per length."""

from __future__ import annotations

MIN_BUCKET = 16


def buckets(max_length: int) -> list[int]:
    """Padded lengths: powers of two from MIN_BUCKET below ``max_length``, then it."""
    out, b = [], MIN_BUCKET
    while b < max_length:
        out.append(b)
        b *= 2
    return out + [max_length]


def bucket_for(n: int, max_length: int) -> int:
    """The smallest bucket holding ``n`` tokens (ValueError past ``max_length``)."""
    for b in buckets(max_length):
        if n <= b:
            return b
    raise ValueError(f"length {n} exceeds max_length {max_length}")
