"""The records of a regenerated request (issue 19): the client-facing exchange, one exchange per later attempt.

The client-facing exchange keeps attempt 1's upstream bytes (mitmproxy's own upstream request: later
attempts' bytes never join them) and the client's bytes, and is flagged `regenerated` when a later
attempt was made. Each later attempt is an exchange of its own: `attempt_of` the client-facing id,
`attempt` 2...N+1, its own request body, upstream headers and bytes, and change rows saying why it was
made. An attempt that was considered and not made (`deterministic`, a spent budget, an admission
refusal) is a `skip` row on the client-facing exchange, since nothing went upstream for it. An attempt
is in the client-facing exchange's trace (issue 20): with a span of its own (export on), that span is a
child of the client-facing one's.

A non-streamed answer (whole_body.py) is recorded the same way, its bodies whole: the client-facing
exchange already holds attempt 1's body, and each later attempt's body is its `response`, not chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from tapfix.proxy.errors import SHUTDOWN_REASON
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.ids import new_capture_id
from tapfix.proxy.regenerate.splice import Decision
from tapfix.proxy.telemetry.context import new_span_id

REGENERATED = "regenerated"
CANCELLED = frozenset({"client_disconnected", SHUTDOWN_REASON})  # flags of an attempt tapfix cancelled


class AttemptLike(Protocol):
    number: int
    body: bytes
    headers_sent: list[tuple[str, str]]
    status: int | None
    headers: list[tuple[str, str]]
    chunks: list[bytes]
    times: list[float]
    started_at: float
    started: float
    ended: float | None
    error: str | None
    flags: set[str]
    decoded: list[bytes] | None


class SessionLike(Protocol):
    @property
    def attempts(self) -> Sequence[AttemptLike]: ...


class DecisionsLike(Protocol):
    """What was decided at each attempt's end and each attempt's tool-call records (splice.AttemptSplice,
    whole_body.WholeBodyRegeneration): `stage_history[k]` belongs to attempt k+1."""

    @property
    def decisions(self) -> Sequence[Decision]: ...

    @property
    def stage_history(self) -> Sequence[Any]: ...


def attempt_records(ex: Exchange, session: SessionLike, splice: DecisionsLike | None) -> list[Exchange]:
    """Fix up `ex` (the client-facing exchange) and return the later attempts' exchanges, to be recorded
    after it."""
    attempts = list(session.attempts)
    whole = ex.response is not None  # a non-streamed answer: bodies, not chunks
    decisions = splice.decisions if splice is not None else []
    for skipped in decisions:
        if not skipped.made:
            ex.changes.extend(skipped.changes)
    if len(attempts) < 2:
        return []
    ex.flags.add(REGENERATED)
    made = {d.attempt: d for d in decisions if d.made}
    stages = splice.stage_history if splice is not None else []
    out = []
    for attempt in attempts[1:]:
        decision = made.get(attempt.number)
        changes = list(decision.changes) if decision is not None else []
        stage = stages[attempt.number - 1] if len(stages) >= attempt.number else None
        flags: set[str] = set()
        if stage is not None:
            changes.extend(stage.changes)
            if stage.outcome != "untouched":
                flags.add(f"toolcall_{stage.outcome}")
        flags |= attempt.flags
        if attempt.error is not None and not attempt.flags & CANCELLED:
            flags.add("upstream_error")  # a client that left (or the shutdown) cancelled it: not the upstream's fault
        out.append(
            replace(
                ex,
                id=new_capture_id(),
                started_at=attempt.started_at,
                request=attempt.body,
                forwarded=None,
                decoded_request=None,
                request_headers=list(attempt.headers_sent),
                forwarded_headers=None,
                status=attempt.status,
                response_headers=list(attempt.headers),
                response_started_at=attempt.times[0] if attempt.times else None,
                response_chunks=[] if whole else list(attempt.chunks),
                chunk_times=[] if whole else [t - attempt.started for t in attempt.times],
                client_response_chunks=None,
                response=b"".join(attempt.chunks) if whole else None,
                client_response=None,
                decoded_chunks=None if whole or attempt.decoded is None else list(attempt.decoded),
                decoded_response=b"".join(attempt.decoded) if whole and attempt.decoded is not None else None,
                ended_at=attempt.ended,
                error=attempt.error,
                changes=changes,
                flags=flags,
                tags=set(),
                attempt_of=ex.id,
                attempt=attempt.number,
                span_id=new_span_id() if ex.span_id is not None else None,
                parent_span_id=ex.span_id if ex.span_id is not None else ex.parent_span_id,
                mark=attempt.started,
                extra={"target": ex.extra["target"]} if "target" in ex.extra else {},  # its upstream, for telemetry
            )
        )
    return out


ATTEMPT_RECORDS = "attempt_records"  # Exchange.extra: later attempts' exchanges, the recorder writes after their parent


def keep_attempt_records(ex: Exchange, records: list[Exchange]) -> None:
    """Hold `records` with those `ex` holds already (a route fallback's failed answers, addons/route_fallback.py,
    come before regeneration's): numbered on after them, so no two attempts of one exchange share a number
    and none is lost."""
    kept: list[Exchange] = ex.extra.setdefault(ATTEMPT_RECORDS, [])
    for record in records:
        record.attempt += len(kept)
    kept.extend(records)
