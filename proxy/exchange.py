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
    stream: bool = False
    tools: list[Any] | None = None
    client_body: bytes = b""
    forwarded_body: bytes | None = None
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    forwarded_headers: list[tuple[str, str]] | None = None
    status: int | None = None
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = ""
    response_started_at: float | None = None
    # Upstream bytes as they arrived and when (perf_counter offsets from `mark`).
    upstream_chunks: list[bytes] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)
    client_chunks: list[bytes] | None = None
    upstream_body: bytes | None = None  # non-streamed responses
    client_body_out: bytes | None = None
    ended_at: float | None = None
    error: str | None = None
    changes: list[Change] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    tags: set[str] = field(default_factory=set)
    session_hint: str | None = None
    source_id: str | None = None  # the capture this one replays
    store_bodies: bool = True
    mark: float = field(default_factory=time.perf_counter)
    extra: dict[str, Any] = field(default_factory=dict)

    def upstream_response(self) -> bytes:
        if self.upstream_body is not None:
            return self.upstream_body
        return b"".join(self.upstream_chunks)

    def client_response(self, upstream: bytes | None = None) -> bytes:
        """What the client received; `upstream` (already joined) is returned as is when nothing differed."""
        if self.client_body_out is not None:
            return self.client_body_out
        if self.client_chunks is not None:
            return b"".join(self.client_chunks)
        return self.upstream_response() if upstream is None else upstream
