"""Capture ids: short, sortable by time, typeable (a prefix is enough on the command line)."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _b32(number: int, width: int) -> str:
    out = []
    for _ in range(width):
        out.append(_ALPHABET[number & 31])
        number >>= 5
    return "".join(reversed(out))


def new_capture_id(now: float | None = None) -> str:
    """10 chars of milliseconds since the epoch, then 6 random chars: sorts by arrival."""
    ms = int((time.time() if now is None else now) * 1000)
    return _b32(ms, 10) + _b32(int.from_bytes(os.urandom(4), "big"), 6)
