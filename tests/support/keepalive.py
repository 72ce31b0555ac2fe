"""The regeneration relay's keep-alive interval for the in-process proxies a test starts.

`tapfix.addons.KEEPALIVE_S` (5 s) is how often a client waiting for a later attempt gets a `: keep-alive`
comment; a proxy reads it when it builds its addon chain. A test that waits for a keep-alive (or for an
attempt delayed past one) would otherwise wait out those 5 s of real time, more than once: under
`keepalive_every(seconds)` the proxies started inside send them every `seconds`, and the test states its
delays in that interval, so what it asserts (keep-alives come while the attempt is awaited, never after
its answer; a client that leaves at the first one cancels the attempt) is the same at any interval.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import tapfix.addons

TEST_KEEPALIVE_S = 1.0  # a fifth of the real interval; still five of the relay's 0.2 s close checks


@contextmanager
def keepalive_every(seconds: float = TEST_KEEPALIVE_S) -> Iterator[float]:
    """Proxies started inside send keep-alives every `seconds` (yielded); the interval is put back after."""
    before = tapfix.addons.KEEPALIVE_S
    tapfix.addons.KEEPALIVE_S = seconds
    try:
        yield seconds
    finally:
        tapfix.addons.KEEPALIVE_S = before
