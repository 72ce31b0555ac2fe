"""One client request's life in the regeneration relay (addons/relay.py): its attempts and the decision
the pipeline hands the relay. Here, not in the addon file, because a stock `mitmdump -s` loads addon files
outside `sys.modules`, where dataclasses can't be built, and the addon must still refuse with a message.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from tapfix.proxy.regenerate import wire
from tapfix.proxy.regenerate.eligibility import Ticket


@dataclass
class Attempt:
    """One upstream request the relay made: what went up and what came back, for its own record."""

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

    def cancel(self) -> None:
        """The client left while it was awaited: cancelled, which is no upstream error."""
        self.error = "the client disconnected: the attempt was cancelled"
        self.flags.add("client_disconnected")
        self.ended = time.perf_counter()

    def fail(self, reason: str, *flags: str) -> None:
        """Mark it failed (the first reason stays: it is the cause)."""
        self.failed = True
        if self.error is None:
            self.error = reason
        self.flags.update(flags)


class RelaySession:
    """One client request routed through the relay. The pipeline calls `end` / `next_attempt` (plain
    methods on the loop's thread); the relay's handler awaits the decision."""

    def __init__(self, origin: str, keepalive_s: float) -> None:
        self.origin = origin
        self.marker = wire.new_marker()
        self.keepalive_s = keepalive_s
        self.attempts: list[Attempt] = []
        self.tickets: list[Ticket] = []  # admission slots of the attempts in flight, released at the end
        self._decision: asyncio.Future[tuple[bytes, float] | None] | None = None
        self._timeout_s: float | None = None
        self.closed = False
        # Set by the stream owner at the response's headers: does a pipeline read the marker? Until it
        # says so the relay writes none (a flow without a splice would wait for a decision forever).
        self.spliced: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def declare(self, spliced: bool) -> None:
        if not self.spliced.done():
            self.spliced.set_result(spliced)

    def _arm(self) -> asyncio.Future[tuple[bytes, float] | None]:
        self._decision = asyncio.get_running_loop().create_future()
        return self._decision

    def _decide(self, value: tuple[bytes, float] | None) -> None:
        if self._decision is None or self._decision.done():
            raise RuntimeError("no attempt is waiting for a decision")
        self._decision.set_result(value)

    def end(self) -> None:
        self._decide(None)

    def next_attempt(self, body: bytes, timeout_s: float, ticket: Ticket | None = None) -> None:
        if ticket is not None:
            self.tickets.append(ticket)
        self._decide((body, timeout_s))

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
        """The client left: a later attempt still awaited is cancelled (the relay sees the close within
        `wire.CLOSE_CHECK_S`, after the records are made, so they say so now)."""
        for attempt in self.attempts[1:]:
            if attempt.ended is None:
                attempt.cancel()

    def release(self) -> None:
        """Free the admission slots held (at each later attempt's end, and when the session ends)."""
        for ticket in self.tickets:
            ticket.release()
        self.tickets = []
