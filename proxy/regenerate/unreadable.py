"""What the pipeline tells the splice (proxy/regenerate/splice.py) when a relayed attempt's stream stopped
being SSE: its own module, since the pipeline builds it and the splice reads it, and neither may import
the other at run time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A relayed attempt whose stream isn't SSE (the splice judges it failed): why, and the retryable
    error events the client gets when no other attempt follows."""

    reason: str
    events: list[bytes]
