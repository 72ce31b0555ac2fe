"""Issue 15 item 10: a malformed HTTP request leaves a record, flagged `malformed_request`.

Two kinds, as mitmproxy meets them:
- the head parses, then the request is rejected (a bad Content-Length or Transfer-Encoding, both at
  once, a chunk size that isn't hex): an exchange with the head, the error and what the client got;
- the head can't be parsed (a bad request line or header line): mitmproxy makes no flow at all, so
  tapfix stores a connection record (tag `connection`): the peer, the first 4 KiB of the bytes,
  mitmproxy's message, and the 400 the client got.

Through a real `tapfix run` (in front of `tapfix mock`) with a raw socket client; each request carries
a nonce, so the test finds its own record among the others.
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import capture_body, load_capture

from tests.support.depth import examples
from tests.support.inproc import InprocProxy, cli

CHAT = b"/v1/chat/completions"


def send_raw(proxy: InprocProxy, data: bytes) -> bytes:
    """Send the bytes, then read until the proxy closes the connection (it does after a malformed request)."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                piece = sock.recv(65536)
            except ConnectionResetError:
                break
            if not piece:
                break
            received += piece
        return received


def find_record(
    proxy: InprocProxy, nonce: str, timeout: float = 5.0, flag: str = "malformed_request"
) -> dict[str, Any]:
    """The record flagged `flag` whose path or request bytes hold `nonce`, with its bodies."""
    db = proxy.extra["db"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(db).exists():
            conn = open_for_reading(db)
            try:
                rows = conn.execute(
                    "select id, path from exchanges where flags like ? order by ts desc limit 500", (f"%{flag}%",)
                ).fetchall()
                for row in rows:
                    capture = load_capture(conn, row["id"])
                    request = capture_body(conn, capture, "request")
                    if nonce in (row["path"] or "") or nonce.encode() in request:
                        capture["request_bytes"] = request
                        capture["client_bytes"] = capture_body(conn, capture, "client_response")
                        return capture
            finally:
                conn.close()
        time.sleep(0.05)
    raise AssertionError(f"no {flag} record holds {nonce} after {timeout}s:\n" + proxy.log()[-2000:])


def body_of(response: bytes) -> bytes:
    return response.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in response else b""


def head_with(nonce: str, *headers: bytes, body: bytes = b"") -> bytes:
    lines = [b"POST " + CHAT + b"?n=" + nonce.encode() + b" HTTP/1.1", b"Host: 127.0.0.1", *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def assert_exchange_record(proxy: InprocProxy, nonce: str, received: bytes) -> dict[str, Any]:
    capture = find_record(proxy, nonce)
    assert capture["method"] == "POST" and nonce in capture["path"], capture
    assert capture["error"], capture
    assert "malformed_request" in capture["flags"], capture["flags"]
    status = int(received.split(b" ", 2)[1]) if received.startswith(b"HTTP/") else None
    assert capture["status"] == status
    assert capture["client_bytes"] == body_of(received)
    return capture


def assert_connection_record(proxy: InprocProxy, nonce: str, sent: bytes, received: bytes) -> dict[str, Any]:
    capture = find_record(proxy, nonce)
    assert "connection" in capture["tags"] and "malformed_request" in capture["flags"], capture
    assert capture["client_addr"] == "127.0.0.1"
    assert capture["request_bytes"] == sent[:4096]
    assert received.startswith(b"HTTP/1.1 400") and capture["status"] == 400
    assert capture["client_bytes"] == body_of(received)
    return capture


def test_truth_10_malformed_bad_content_length_is_stored_with_its_head(proxy: InprocProxy) -> None:
    nonce = uuid.uuid4().hex
    sent = head_with(nonce, b"Content-Type: application/json", b"Content-Length: twelve", body=b"{}")
    received = send_raw(proxy, sent)
    assert received.startswith(b"HTTP/1.1 400"), received
    capture = assert_exchange_record(proxy, nonce, received)
    assert ["Content-Length", "twelve"] in [list(h) for h in capture["request_headers"]], capture["request_headers"]
    assert "content-length" in capture["error"].lower()


def test_truth_10_malformed_bad_chunking_is_stored_with_its_head(proxy: InprocProxy) -> None:
    nonce = uuid.uuid4().hex
    sent = head_with(nonce, b"Transfer-Encoding: chunked", body=b"zz\r\nhello\r\n0\r\n\r\n")
    received = send_raw(proxy, sent)
    capture = assert_exchange_record(proxy, nonce, received)
    assert ["Transfer-Encoding", "chunked"] in [list(h) for h in capture["request_headers"]]


def test_truth_10_malformed_request_line_is_a_connection_record(proxy: InprocProxy) -> None:
    nonce = uuid.uuid4().hex
    sent = b"NONSENSE-" + nonce.encode() + b"\r\nHost: x\r\n\r\n"
    received = send_raw(proxy, sent)
    capture = assert_connection_record(proxy, nonce, sent, received)
    assert "Bad HTTP request line" in capture["error"], capture["error"]
    shown = cli("captures", "show", capture["id"], "--db", str(proxy.extra["db"]))
    assert shown.returncode == 0, shown.stderr
    assert b"connection record" in shown.stdout and b"Bad HTTP request line" in shown.stdout, shown.stdout


def test_truth_10_malformed_long_garbage_keeps_its_first_4_kib(proxy: InprocProxy) -> None:
    nonce = uuid.uuid4().hex
    sent = nonce.encode() + b" " + b"x" * 6000 + b" HTTP/1.1 more\r\n\r\n"
    received = send_raw(proxy, sent)
    capture = assert_connection_record(proxy, nonce, sent, received)
    assert len(capture["request_bytes"]) == 4096


def test_a_body_cut_short_by_its_client_is_recorded_as_a_disconnect(proxy: InprocProxy) -> None:
    nonce = uuid.uuid4().hex
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(head_with(nonce, b"Content-Length: 100", body=b'{"model": '))
        sock.shutdown(socket.SHUT_WR)  # gone before the other 90 bytes
        sock.recv(65536)
    capture = find_record(proxy, nonce, flag="client_disconnected")
    assert "malformed_request" not in capture["flags"] and "peer closed connection" in capture["error"]
    assert capture["method"] == "POST" and capture["status"] is None


# -- the hypothesis set of malformed heads --------------------------------------------------------
TOKEN = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~", min_size=1)
# Any byte but CR, LF, NUL and the spaces that split a request line.
WORD = st.binary(min_size=1, max_size=30).map(lambda b: re.sub(rb"[\r\n\x00\t\x0b\x0c ]", b"x", b))


def _bad_request_line(draw: Any, nonce: bytes) -> bytes:
    kind = draw(st.sampled_from(["one", "two", "many", "version", "target", "header"]))
    method = draw(TOKEN).encode()
    if kind == "one":
        return nonce + draw(WORD)
    if kind == "two":
        return method + b" /" + nonce
    if kind == "many":
        extra = draw(st.lists(WORD, min_size=1, max_size=3))
        return b" ".join([method, b"/" + nonce, b"HTTP/1.1", *extra])
    if kind == "version":
        version = draw(WORD.filter(lambda v: not re.fullmatch(rb"HTTP/\d\.\d", v)))
        return method + b" /" + nonce + b" " + version
    if kind == "target":  # neither origin-form nor absolute: no "/" first, no "://"
        target = nonce + draw(WORD).replace(b"://", b"x")
        return (method if method != b"CONNECT" else b"GET") + b" " + target + b" HTTP/1.1"
    line = draw(WORD.filter(lambda w: b":" not in w and w[:1] not in b" \t"))
    return method + b" /" + nonce + b" HTTP/1.1\r\nHost: x\r\n" + line  # a header line without a colon


def _bad_framing(draw: Any, nonce: str) -> bytes:
    kind = draw(st.sampled_from(["content-length", "two-lengths", "transfer-encoding", "both", "chunk-size"]))
    if kind == "content-length":
        value = draw(
            st.text(alphabet="0123456789abcxyz+-., ", min_size=1, max_size=12).filter(
                lambda v: v.strip() != "" and not re.fullmatch(r"\s*\d+\s*", v)
            )
        )
        return head_with(nonce, b"Content-Length: " + value.encode(), body=b"{}")
    if kind == "two-lengths":
        a, b = draw(st.lists(st.integers(0, 99), min_size=2, max_size=2, unique=True))
        return head_with(nonce, b"Content-Length: %d" % a, b"Content-Length: %d" % b, body=b"{}")
    if kind == "transfer-encoding":
        value = draw(TOKEN.filter(lambda v: v.lower() not in ("chunked", "identity", "gzip", "deflate", "compress")))
        return head_with(nonce, b"Transfer-Encoding: " + value.encode(), body=b"{}")
    if kind == "both":
        return head_with(nonce, b"Transfer-Encoding: chunked", b"Content-Length: 2", body=b"0\r\n\r\n")
    size = draw(WORD.filter(lambda w: not re.fullmatch(rb"[0-9a-fA-F]+(;.*)?", w)))
    return head_with(nonce, b"Transfer-Encoding: chunked", body=size + b"\r\nhello\r\n0\r\n\r\n")


@st.composite
def malformed_heads(draw: Any) -> tuple[str, str, bytes]:
    """(kind of record, nonce, bytes): a head that can't be parsed, or one whose framing is rejected."""
    nonce = uuid.uuid4().hex
    if draw(st.booleans()):
        return "connection", nonce, _bad_request_line(draw, nonce.encode()) + b"\r\n\r\n"
    return "exchange", nonce, _bad_framing(draw, nonce)


@settings(max_examples=examples(100), deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=malformed_heads())
def test_truth_10_malformed_heads_each_leave_a_record(proxy: InprocProxy, case: tuple[str, str, bytes]) -> None:
    kind, nonce, sent = case
    received = send_raw(proxy, sent)
    if kind == "connection":
        assert_connection_record(proxy, nonce, sent, received)
    else:
        assert_exchange_record(proxy, nonce, received)


def test_well_formed_traffic_between_the_malformed_is_stored_unflagged(proxy: InprocProxy) -> None:
    """The records are for malformed requests only: a good one next to them stays a plain exchange."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    nonce = uuid.uuid4().hex
    received = send_raw(
        proxy,
        head_with(nonce, b"Content-Type: application/json", b"Connection: close", b"Content-Length: %d" % len(body))
        + body,
    )
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    with pytest.raises(AssertionError):
        find_record(proxy, nonce, timeout=1.0)


def test_with_a_token_each_peer_has_a_budget_of_malformed_records(tmp_path: Path, mock) -> None:
    """Malformed records are written before anyone can be authenticated: with a token, a peer gets
    PEER_BUDGET of them a minute and the rest are counted in health, so a stranger can't fill the store."""
    from tapfix.addons.malformed import PEER_BUDGET

    from tests.support.inproc import start_proxy

    token = "s3cret-token-123"
    proxy = start_proxy(tmp_path, mock.url, "--token", token)
    try:
        sent = PEER_BUDGET + 5
        for _ in range(sent):
            assert send_raw(proxy, b"NONSENSE-" + uuid.uuid4().hex.encode() + b"\r\n\r\n").startswith(b"HTTP/1.1 400")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            health = httpx.get(f"{proxy.url}/tapfix/health", headers={"authorization": f"Bearer {token}"}).json()
            if (
                health["malformed_unrecorded"] == sent - PEER_BUDGET
                and health["capture_writer"]["written"] >= PEER_BUDGET
            ):
                break
            time.sleep(0.1)
        assert health["malformed_unrecorded"] == sent - PEER_BUDGET, health
    finally:
        proxy.stop()
    conn = open_for_reading(proxy.extra["db"])
    try:
        (count,) = conn.execute("select count(*) from exchanges where tags like '%connection%'").fetchone()
    finally:
        conn.close()
    assert count == PEER_BUDGET
