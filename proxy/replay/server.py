"""Server-side replay: turn a capture back into the upstream response the mock plays, byte for byte.

`tapfix mock --db PATH --capture ID` serves this to every request, so a client (or the proxy's
repair stages) can be tested again and again against a response that once went wrong, with the
upstream's own chunking and pacing: chunks are cut at the recorded sizes and sent at the recorded
offsets from the request's arrival.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tapfix.proxy.http_headers import HOP_BY_HOP
from tapfix.proxy.mock.options import RecordedResponse
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.exchange_row import unpack_timing
from tapfix.proxy.store.redact import REDACTED

if TYPE_CHECKING:
    from tapfix.proxy.store.reader import CaptureReader

# Framing is the mock's own business (it re-chunks); the others were added by tapfix, not the upstream.
_DROP_HEADERS = HOP_BY_HOP | {"content-length", "content-encoding"}


def recorded_response(reader: CaptureReader, capture_id: str) -> RecordedResponse:
    """The capture's raw upstream response: status, headers, and (seconds, bytes) chunks; from any store's
    reader (`mock --capture`)."""
    capture = reader.load_capture(capture_id)
    if capture.get("status") is None:
        raise StoreError(
            f"capture {capture['id']} has no upstream response to replay"
            + (f" ({capture['error']})" if capture.get("error") else "")
        )
    body = reader.capture_body(capture, "response")
    headers = [
        (str(name), str(value))
        for name, value in capture.get("response_headers") or []
        if str(name).lower() not in _DROP_HEADERS
        and not str(name).lower().startswith("x-tapfix-")
        and value != REDACTED
    ]
    return RecordedResponse(int(capture["status"]), headers, split_chunks(body, capture))


def split_chunks(body: bytes, capture: dict[str, Any]) -> list[tuple[float, bytes]]:
    """Cut the body at the recorded chunk sizes; anything unaccounted for goes out with the last chunk."""
    timing = unpack_timing(capture.get("chunk_timing"))
    chunks: list[tuple[float, bytes]] = []
    pos = 0
    for ms, size in timing:
        if pos >= len(body):
            break
        chunks.append((max(0.0, float(ms)) / 1000, body[pos : pos + size]))
        pos += size
    if pos < len(body):
        first_byte = capture.get("upstream_first_byte_ms") or capture.get("duration_ms") or 0.0
        at = chunks[-1][0] if chunks else max(0.0, float(first_byte)) / 1000
        chunks.append((at, body[pos:]))
    return [(at, data) for at, data in chunks if data]
