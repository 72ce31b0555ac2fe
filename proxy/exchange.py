"""One request/response exchange as the addons see it, handed to the store when it ends.

Addons fill it on the event loop with references only (no copies, no parsing); the writer thread
does the expensive work (assembly, redaction, deltas) after the response is gone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.ids import new_capture_id

# The flag of an exchange tapfix answered itself (an unknown model, a refused request, an unreachable
# upstream, the shutdown's 503, the models listing): no upstream answered it, whatever its status.
TAPFIX_ANSWERED = "tapfix_answered"


@dataclass(slots=True)
class Exchange:
    id: str = field(default_factory=new_capture_id)
    started_at: float = field(default_factory=time.time)
    client_addr: str = ""
    method: str = ""
    path: str = ""
    url: str = ""
    upstream_url: str = ""
    user_agent: str = ""
    model: str | None = None
    served_model: str | None = None
    # Where its prompt stopped extending the previous request of its thread (None: it extends it, or it is a
    # thread's first); set by the writer (store/prefix_breaks.py), read by the row and telemetry.
    prefix_break: dict[str, Any] | None = None
    route: str | None = None  # the route taken (issue 38)
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: Any = None  # the request's, as sent (a named one lets a chat call finish with "stop")
    choices_asked: Any = None  # the request's `n`, as sent (None: absent); only one choice can be regenerated
    # The four bodies, named as the store names them: what the client sent, what went upstream (only
    # when it differs), what the upstream answered, what the client received (only when it differs).
    # A stream's bodies arrive as chunks; a plain body as one `bytes`.
    request: bytes = b""
    forwarded: bytes | None = None
    decoded_request: bytes | None = None  # `request` decoded, when it came compressed
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    forwarded_headers: list[tuple[str, str]] | None = None
    status: int | None = None  # what the client got (tapfix may answer 502 for a 200 it couldn't repair)
    upstream_status: int | None = None  # what the upstream answered, when it answered
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = ""
    response_started_at: float | None = None
    # Upstream bytes as they arrived and when (perf_counter offsets from `mark`).
    response_chunks: list[bytes] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)
    client_response_chunks: list[bytes] | None = None  # set when a stage may change the stream
    response: bytes | None = None  # non-streamed responses
    client_response: bytes | None = None  # a non-streamed body tapfix changed
    # The upstream's body with its Content-Encoding undone (None: it came plain, or couldn't be
    # decoded): one piece per `response_chunks` entry for a stream, the whole body otherwise.
    decoded_chunks: list[bytes] | None = None
    decoded_response: bytes | None = None
    ended_at: float | None = None
    error: str | None = None
    changes: list[Change] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    tags: set[str] = field(default_factory=set)
    session_hint: str | None = None
    source_id: str | None = None  # the capture this one replays
    # A regeneration attempt (issue 19) is an exchange of its own: `attempt_of` is the id of the
    # client-facing capture it was made for (the one in `x-tapfix-capture-id`), `attempt` its number.
    # 1 is the client-facing exchange itself (`attempt_of` None); attempts are 2...N+1.
    attempt_of: str | None = None
    attempt: int = 1
    store_bodies: bool = True
    # W3C trace context (issue 20): the trace this exchange belongs to (the client's `traceparent`, or
    # tapfix's own when export is on), tapfix's span in it, and the client's span (its parent), as hex.
    trace_id: str | None = None
    span_id: str | None = None
    parent_span_id: str | None = None
    mark: float = field(default_factory=time.perf_counter)
    extra: dict[str, Any] = field(default_factory=dict)

    def note_request_json(self, parsed: object) -> None:
        """What the recorder, the router and the stream stages need from a request body: model, stream,
        tools, tool_choice, n."""
        if not isinstance(parsed, dict):
            self.flags.add("malformed_request_body")
            return
        model = parsed.get("model")
        self.model = model if isinstance(model, str) else None
        self.stream = parsed.get("stream") is True
        tools = parsed.get("tools")
        self.tools = tools if isinstance(tools, list) and tools else None
        self.tool_choice = parsed.get("tool_choice")
        self.choices_asked = parsed.get("n")

    def answered_by_tapfix(self, error: str | None = None, upstream: str = "") -> None:
        """tapfix answered this request itself: flagged, the upstream URL only where the request had
        gone (`upstream`: the shutdown may end one the upstream never answered), and `error`, the
        error object the client got as JSON text, as its error."""
        self.flags.add(TAPFIX_ANSWERED)
        self.upstream_url = upstream
        if error is not None:
            self.error = error

    @property
    def tapfix_answered(self) -> bool:
        return TAPFIX_ANSWERED in self.flags

    def response_body(self) -> bytes:
        """What the upstream answered, whole."""
        if self.response is not None:
            return self.response
        return b"".join(self.response_chunks)

    def mark_undecodable(self, reason: str) -> None:
        """Its answer's Content-Encoding can't be undone: the bytes pass as they came, flagged, and the
        reason is kept (a stream that already sent decoded text quotes it in its error)."""
        self.flags.add("undecodable_body")
        self.extra["undecodable"] = reason

    def readable_request(self) -> bytes:
        """What the client sent, as JSON text to read: decoded when it came compressed."""
        return self.request if self.decoded_request is None else self.decoded_request

    def readable_chunks(self) -> list[bytes]:
        """The upstream's stream as text to assemble: decoded when it came compressed."""
        return self.response_chunks if self.decoded_chunks is None else self.decoded_chunks

    def readable(self, client: bytes) -> bytes:
        """What the client received (`client_response_body`), decoded when it was the upstream's
        compressed bytes unchanged: the store keeps those bytes and assembles from this."""
        if self.client_response is not None or self.client_response_chunks is not None:
            return client  # tapfix sent its own (plain) bytes
        if self.decoded_response is not None:
            return self.decoded_response
        return client if self.decoded_chunks is None else b"".join(self.decoded_chunks)

    def client_response_body(self, response: bytes | None = None) -> bytes:
        """What the client received; `response` (already joined) is returned as is when nothing differed."""
        if self.client_response is not None:
            return self.client_response
        if self.client_response_chunks is not None:
            return b"".join(self.client_response_chunks)
        return self.response_body() if response is None else response
