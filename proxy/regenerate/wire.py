"""The relay's HTTP/1.1 and SSE framing, pure: what addons/relay.py reads from mitmproxy and writes back.

mitmproxy is the relay's only client (loopback, one event loop), so the server side needs only what
mitmproxy sends: a request head, a body framed by Content-Length or chunked. The relay answers chunked,
so it can add bytes the upstream never sent: the attempt-end marker (a private SSE comment carrying a
per-session nonce, stripped by the pipeline, never forwarded) and `: keep-alive` comments while the next
attempt is awaited. A marker always starts a new event, so the pipeline's splitter sees it whole however
mitmproxy cuts the reads.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Final

SESSION_HEADER: Final = "x-tapfix-relay"  # the session token mitmproxy carries to the relay
HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "content-length",
        "host",
        SESSION_HEADER,
    }
)
KEEPALIVE: Final = b": keep-alive\n\n"
BAD_GATEWAY: Final = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n"
LAST_CHUNK: Final = b"0\r\n\r\n"
# How often a pending attempt looks whether the client left (streamed: mitmproxy closed the relay's
# connection; whole body: the client connection), so a cancelled attempt stops within it.
CLOSE_CHECK_S: Final = 0.2


def new_marker() -> bytes:
    """An attempt-end marker no upstream can forge: the nonce is fresh per session."""
    return f": tapfix-attempt-end {secrets.token_hex(8)}\n\n".encode()


def marker_after(last: bytes, marker: bytes) -> bytes:
    """The marker as the next bytes after `last` (the upstream's final read): a blank line first when
    the upstream stopped inside an event, so the marker is an event of its own."""
    if not last or last.endswith((b"\n\n", b"\r\n\r\n", b"\r\r")):
        return marker
    for line_end in (b"\r\n", b"\n", b"\r"):  # a line ended: one more line end makes the blank line
        if last.endswith(line_end):
            return line_end + marker
    return b"\n\n" + marker


def unspliceable(status: int, content_type: str) -> str | None:
    """Why an upstream answer is no event stream the pipeline can splice (None: it is one)."""
    if status != 200:
        return f"the upstream answered {status}"
    if "text/event-stream" not in content_type:
        return f"the upstream answered {content_type or 'no content type'}, not an event stream"
    return None


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (nothing for no data: an empty chunk would end the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


def forwardable(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Headers without the hop-by-hop ones, Host and the relay's session token."""
    return [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]


def parse_head(head: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    """(method, path, headers) of a request head ending in CRLF CRLF; ValueError when it isn't one."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError(f"not an HTTP/1.1 request line: {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"not a header line: {line[:80]!r}")
            headers.append((name.strip(), value.strip()))
    return parts[0], parts[1], headers


def response_head(status: int, reason: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """The relay's response head: the upstream's status and headers, re-framed as chunked."""
    lines = [f"HTTP/1.1 {status} {reason or 'OK'}\r\n"]
    lines += [f"{k}: {v}\r\n" for k, v in forwardable(headers)]
    lines.append("transfer-encoding: chunked\r\n\r\n")
    return "".join(lines).encode("latin-1", "replace")


def header(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name), None)


def chunk_size(line: bytes) -> int:
    """The size of a chunk from its size line (extensions ignored); ValueError when it isn't one."""
    size = int(line.split(b";", 1)[0].strip(), 16)
    if size < 0:
        raise ValueError("negative chunk size")
    return size
