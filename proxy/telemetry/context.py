"""W3C Trace Context (https://www.w3.org/TR/trace-context/): reading and writing `traceparent`.

An agent that traces its own work sends `traceparent: 00-{trace-id}-{parent-id}-{flags}`; tapfix's span
for the exchange becomes that span's child, and vLLM or SGLang (which accept the header) nest their
spans under tapfix's. Only what the spec's version 00 defines is read: a header that breaks its rules
(uppercase hex, wrong lengths, all-zero ids, version `ff`, several `traceparent` headers) is treated as
absent, as the spec asks, so a broken client starts a new trace instead of poisoning one. `tracestate`
is never parsed here: it is the vendors' and passes through untouched.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

HEADER = "traceparent"
STATE_HEADER = "tracestate"
VERSION = "00"
SAMPLED = 0x01  # the only flag version 00 defines: the caller may have recorded its span
_HEX = frozenset("0123456789abcdef")
_V00_LENGTH = 55  # "00-" + 32 + "-" + 16 + "-" + 2


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A valid `traceparent`: ids as lowercase hex, flags as the byte's value."""

    trace_id: str  # 32 hex digits, not all zero
    span_id: str  # 16 hex digits, not all zero: the sender's span (tapfix's parent)
    flags: int = SAMPLED

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    def header(self) -> str:
        """The header value, always version 00 (the version tapfix speaks)."""
        return format_traceparent(self.trace_id, self.span_id, self.flags)


def _hex(value: str, digits: int) -> bool:
    return len(value) == digits and _HEX.issuperset(value)


def _nonzero(value: str) -> bool:
    return value.strip("0") != ""


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The parsed header, or None when it is absent or invalid (invalid counts as absent).

    A later version than 00 is read as the spec says a version-00 reader must: its first four fields
    with version 00's rules, anything after them ignored only when it follows a `-`."""
    if value is None:
        return None
    value = value.strip(" \t")  # HTTP's optional whitespace around a field value
    if len(value) < _V00_LENGTH:
        return None
    version = value[:2]
    if not _hex(version, 2) or version == "ff" or value[2] != "-":
        return None
    if version == VERSION and len(value) != _V00_LENGTH:
        return None
    if len(value) > _V00_LENGTH and value[_V00_LENGTH] != "-":
        return None
    trace_id, span_id, flags = value[3:35], value[36:52], value[53:55]
    if value[35] != "-" or value[52] != "-":
        return None
    if not (_hex(trace_id, 32) and _hex(span_id, 16) and _hex(flags, 2)):
        return None
    if not (_nonzero(trace_id) and _nonzero(span_id)):
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))


def traceparent_of(values: list[str]) -> TraceParent | None:
    """The trace context of a request with these `traceparent` header values (every one, repeats kept):
    none, or more than one, is no context."""
    return parse_traceparent(values[0]) if len(values) == 1 else None


def format_traceparent(trace_id: str, span_id: str, flags: int = SAMPLED) -> str:
    """`00-{trace_id}-{span_id}-{flags}`; ValueError for ids a reader would refuse."""
    if not (_hex(trace_id, 32) and _nonzero(trace_id)):
        raise ValueError(f"trace id must be 32 lowercase hex digits, not all zero: {trace_id!r}")
    if not (_hex(span_id, 16) and _nonzero(span_id)):
        raise ValueError(f"span id must be 16 lowercase hex digits, not all zero: {span_id!r}")
    if not 0 <= flags <= 0xFF:
        raise ValueError(f"trace flags are one byte: {flags}")
    return f"{VERSION}-{trace_id}-{span_id}-{flags:02x}"


def _new_id(nbytes: int) -> str:
    while True:  # all zero is invalid; at 2**-64 odds or less, a second draw is all it could take
        value = secrets.token_hex(nbytes)
        if _nonzero(value):
            return value


def new_trace_id() -> str:
    """A random trace id (16 bytes), never all zero."""
    return _new_id(16)


def new_span_id() -> str:
    """A random span id (8 bytes), never all zero."""
    return _new_id(8)


@dataclass(frozen=True, slots=True)
class SpanContext:
    """An exchange's place in a trace, decided from the client's `traceparent` header values.

    `forward` is the `traceparent` to send upstream in place of the client's, or None: send the
    client's headers as they came."""

    trace_id: str | None
    span_id: str | None  # tapfix's own span; None: tapfix records no span for this exchange
    parent_span_id: str | None  # the client's span
    forward: str | None


def span_context(values: list[str], export_on: bool) -> SpanContext:
    """Parent-based sampling: with export off, tapfix only notes the client's trace (its header passes
    byte for byte). With export on, a sampled or absent client trace gets a span of tapfix's own,
    forwarded as the upstream's parent; an unsampled one is left alone, as the client decided."""
    incoming = traceparent_of(values)
    trace_id = incoming.trace_id if incoming is not None else None
    parent = incoming.span_id if incoming is not None else None
    if not export_on or (incoming is not None and not incoming.sampled):
        return SpanContext(trace_id, None, parent, None)
    span_id = new_span_id()
    if incoming is None:
        trace_id = new_trace_id()
        return SpanContext(trace_id, span_id, None, format_traceparent(trace_id, span_id))
    return SpanContext(
        incoming.trace_id, span_id, parent, format_traceparent(incoming.trace_id, span_id, incoming.flags)
    )
