"""One streamed client request's attempts (addons/attempts.py) and the decision the pipeline's splice hands
them. Here, not in the addon file, because a stock `mitmdump -s` loads addon files outside `sys.modules`,
where dataclasses can't be built, and the addon must still refuse with a message.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tapfix.proxy.errors import SHUTDOWN_REASON
from tapfix.proxy.regenerate.eligibility import Ticket

# How a run of later attempts ended (addons/attempts.py): the splice ended the stream (ENDED), the last
# attempt broke off after its bytes went out (CUT), the client left (LEFT), the shutdown grace ended it.
ENDED, CUT, LEFT, SHUTDOWN = "ended", "cut", "left", "shutdown"


@dataclass
class Attempt:
    """One upstream request of a client request's attempts: what went up and what came back, for its record."""

    number: int
    body: bytes
    headers_sent: list[tuple[str, str]] = field(default_factory=list)
    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # perf_counter at each chunk
    started_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)
    ended: float | None = None
    error: str | None = None
    # The attempt brought no answer the pipeline can read (a non-200 status, not an event stream, a coding
    # that can't be undone, no answer within the budget, not SSE): `error` says why. A later attempt's
    # failure is judged like an unrecoverable call (proxy/regenerate/splice.py), never forwarded.
    failed: bool = False
    flags: set[str] = field(default_factory=set)  # its record's own (`client_disconnected`, `not_sse`, ...)
    decoded: list[bytes] | None = None  # its body with the Content-Encoding undone, one piece per chunk

    def cancel(self, why: str = "client_left") -> None:
        """The client left (or, `why` "shutdown", the shutdown grace ended) while it was awaited: cancelled,
        which is no upstream error."""
        if why == "shutdown":
            self.error = "tapfix shut down: the attempt was cancelled"
            self.flags.add(SHUTDOWN_REASON)
        else:
            self.error = "the client disconnected: the attempt was cancelled"
            self.flags.add("client_disconnected")
        self.ended = time.perf_counter()

    def fail(self, reason: str, *flags: str) -> None:
        """Mark it failed (the first reason stays: it is the cause)."""
        self.failed = True
        if self.error is None:
            self.error = reason
        self.flags.update(flags)


class AttemptSession:
    """One streamed client request that may get later attempts. The pipeline's splice calls `end` /
    `next_attempt` (plain methods, synchronously at an attempt's end); the stream owner's attempt loop
    (addons/attempts.py) takes each planned attempt and records it here.

    Attempt 1 is mitmproxy's own upstream request: its bytes are the exchange's (`response_chunks`), so its
    `Attempt` here carries what was sent and the answer's head only."""

    def __init__(self, first: Attempt, keepalive_s: float) -> None:
        self.keepalive_s = keepalive_s
        self.attempts: list[Attempt] = [first]
        self.tickets: list[Ticket] = []  # admission slots of the attempts in flight, released at the end
        self._plan: tuple[bytes, float] | None = None
        self.ended = False

    def end(self) -> None:
        self._plan, self.ended = None, True

    def next_attempt(self, body: bytes, timeout_s: float, ticket: Ticket | None = None) -> None:
        if ticket is not None:
            self.tickets.append(ticket)
        self._plan = (body, timeout_s)

    def take(self) -> tuple[bytes, float] | None:
        """The next attempt's body and time budget, once (None: no attempt is planned)."""
        plan, self._plan = self._plan, None
        return plan

    def failure(self) -> str | None:
        """Why the last attempt brought no answer the pipeline can read (None: it did, or it broke off
        mid-stream, which the pipeline sees for itself)."""
        last = self.attempts[-1] if self.attempts else None
        return last.error if last is not None and last.failed else None

    def mark_failed(self, reason: str, *flags: str) -> None:
        """The pipeline found the last attempt's answer unreadable (its stream isn't SSE)."""
        if self.attempts:
            self.attempts[-1].fail(reason, *flags)

    def client_left(self) -> None:
        """The client left: a later attempt still running is cancelled (its record says so)."""
        for attempt in self.attempts[1:]:
            if attempt.ended is None:
                attempt.cancel()

    def release(self) -> None:
        """Free the admission slots held (at each later attempt's end, and when the session ends)."""
        for ticket in self.tickets:
            ticket.release()
        self.tickets = []
