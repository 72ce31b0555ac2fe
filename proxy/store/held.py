"""What the writer holds while its database is out of reach (down, restarting, cut off), and the state
health shows for it: traffic never waits on the store, so the exchanges wait here instead.

Decision (issue 21): held in memory, bounded, and beyond the bound counted as lost; no spill to a
local SQLite file. A spill file would have to be written as fast as traffic arrives on a host that
may have no disk to spare, then merged back into the shared database by id with sessions re-derived,
and it would hide an outage that lasts hours behind a growing file. Memory covers what a restart,
a failover or a network blip takes (seconds to minutes, see MAX_HELD); an outage longer than that
is an incident, and health says so: `failures_by_cause.queue_full` counts every exchange dropped.

- The bound is a number of exchanges and of bytes (bodies and chunks, the bulk of an exchange's
  memory), whichever is reached first; beyond it the OLDEST are dropped, so what the database
  gets when it returns is the latest traffic.
- The writer retries with a backoff (0.2 s doubling to 5 s) on a new connection, and while it waits
  it keeps moving the submit queue here, so the bound applies to everything not yet written.
- When the database returns, what is held is written first, in order, in the writer's usual
  batches, before anything submitted later.
"""

from __future__ import annotations

import datetime
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Literal

from tapfix.proxy.quantities import human_bytes

if TYPE_CHECKING:
    from tapfix.proxy.exchange import Exchange

# 10,000 exchanges: at 50 exchanges/s (a busy team's fleet instance) 200 s of traffic, more than a
# restart or failover takes (a PostgreSQL restart: 1.5-2.5 s measured). 256 MiB: a process's memory
# a host can spare without notice. Which binds first depends on the bodies: at the average of 26 KiB
# an exchange they meet; agents deep in a session resend 100 KiB and more each turn, and then the
# bytes bind (2,600 exchanges, 52 s at 50/s): raise them with `--store-queue-bytes` on such a fleet.
MAX_HELD = 10_000
MAX_HELD_BYTES = 256 * 1024 * 1024
MIN_HELD_BYTES = 1024 * 1024  # `--store-queue-bytes` below this holds next to nothing: surely a missing unit
FIRST_RETRY_S = 0.2
MAX_RETRY_S = 5.0

State = Literal["ok", "unavailable", "starting"]


def exchange_bytes(ex: Exchange) -> int:
    """What holding `ex` costs, near enough: its bodies and chunks."""
    size = len(ex.request) + len(ex.forwarded or b"") + len(ex.response or b"") + len(ex.client_response or b"")
    size += sum(len(c) for c in ex.response_chunks)
    if ex.client_response_chunks is not None:
        size += sum(len(c) for c in ex.client_response_chunks)
    return size + len(ex.decoded_request or b"") + len(ex.decoded_response or b"")


def _iso(when: float | None) -> str | None:
    return None if when is None else datetime.datetime.fromtimestamp(when, datetime.UTC).isoformat(timespec="seconds")


class Held:
    """The held exchanges, oldest first, and whether the database can be reached (writer thread only;
    health reads it from the event loop, which sees a consistent enough picture under the GIL)."""

    def __init__(self, max_exchanges: int = MAX_HELD, max_bytes: int = MAX_HELD_BYTES, *, starting: str | None = None):
        if max_exchanges < 1 or max_bytes < 1:
            raise ValueError("the store queue must hold at least one exchange")
        self.max_exchanges, self.max_bytes = max_exchanges, max_bytes
        self._items: deque[tuple[Exchange, int]] = deque()
        self.bytes = 0
        self.bound_hit: Literal["exchanges", "bytes"] | None = None  # the bound the last drop was for
        self.state: State = "starting" if starting else "ok"
        self.since: float | None = time.time() if starting else None
        self.reason = starting
        self.delay = FIRST_RETRY_S if starting else 0.0  # before the next attempt
        self.attempts = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, exchanges: list[Exchange]) -> list[Exchange]:
        """At the back; the oldest dropped to keep within the bound (the caller counts them lost)."""
        for ex in exchanges:
            size = exchange_bytes(ex)
            self._items.append((ex, size))
            self.bytes += size
        dropped: list[Exchange] = []
        while len(self._items) > self.max_exchanges or (self.bytes > self.max_bytes and len(self._items) > 1):
            self.bound_hit = "exchanges" if len(self._items) > self.max_exchanges else "bytes"
            ex, size = self._items.popleft()
            self.bytes -= size
            dropped.append(ex)
        return dropped

    def why_full(self) -> str:
        """What the last drop was for, naming the bound that was hit and the option that sets it."""
        if self.bound_hit == "bytes":
            return (
                f"the store queue is full ({self.max_bytes} bytes, {human_bytes(self.max_bytes)} of bodies: "
                "--store-queue-bytes)"
            )
        return f"the store queue is full ({self.max_exchanges} exchanges: --store-queue)"

    def take(self, n: int) -> list[Exchange]:
        """The oldest `n` (or fewer), out of the hold: written now, or `put_back` if that fails."""
        taken: list[Exchange] = []
        while self._items and len(taken) < n:
            ex, size = self._items.popleft()
            self.bytes -= size
            taken.append(ex)
        return taken

    def put_back(self, exchanges: list[Exchange]) -> None:
        """At the front, in order: a batch taken that could not be written."""
        for ex in reversed(exchanges):
            size = exchange_bytes(ex)
            self._items.appendleft((ex, size))
            self.bytes += size

    def failed(self, reason: str) -> None:
        """The database couldn't be reached (again): wait longer before the next attempt."""
        if self.state == "ok":
            self.state, self.since = "unavailable", time.time()
        self.reason = reason
        self.attempts += 1
        self.delay = min(MAX_RETRY_S, self.delay * 2) if self.delay else FIRST_RETRY_S

    def reached(self) -> None:
        """A transaction committed: the database is back (what is held is written next, at once)."""
        self.state, self.since, self.reason, self.delay, self.attempts = "ok", None, None, 0.0, 0

    def health(self) -> dict[str, Any]:
        """Under health's `capture_writer.store`: `state` ok / unavailable (lost the database) / starting
        (not reached yet); `held` exchanges (and `held_bytes`) waiting in memory for it, up to
        `max_held` / `max_held_bytes`; beyond that the oldest are lost (`failures_by_cause.queue_full`)."""
        return {
            "state": self.state,
            "since": _iso(self.since),
            "reason": self.reason,
            "retries": self.attempts,
            "held": len(self._items),
            "held_bytes": self.bytes,
            "max_held": self.max_exchanges,
            "max_held_bytes": self.max_bytes,
            "when_full": "oldest held are lost (counted in failures_by_cause.queue_full); no spill to disk",
        }
