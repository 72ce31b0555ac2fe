"""A hypothesis fuzz of the capture path, through the real proxy in front of the real mock (both in the
test process; the repros are this test's processes).

Arbitrary bytes wherever HTTP/1.1 framing allows them, sent over a raw socket: token characters in
the method; any byte but CR, LF and NUL in header values (and no whitespace at either end, which
is not part of a value), and in the path (where whitespace ends the request target); any bytes in
the body. Every such exchange must be captured, and its repro export (curl or python, run against a
server that records bytes) must send exactly what the client sent. Well-formed requests and streams
are interleaved, and their captures must all be there too. The malformed heads (which produce the
malformed-request record) are another test's.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.replay.export import curl_script, python_script
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import capture_body, load_capture

from tests.support.inproc import InprocProxy, start_mock, start_proxy
from tests.support.procs import STORE_POLL_S, response_head, wait_capture
from tests.support.rawserver import RawServer

TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
EDGE_SPACE = b" \t\x0b\x0c"  # stripped from a header value's ends by every HTTP/1.1 parser
TARGET_BYTES = bytes(b for b in range(0x01, 0x100) if b not in b"\r\n \t\x0b\x0c")  # whitespace ends the target
VALUE_BYTES = bytes(b for b in range(0x01, 0x100) if b not in b"\r\n")
# Key-looking values are redacted on purpose (the export then drops the header): not generated.
KEYLIKE = re.compile(rb"(sk|pk|rk|sess|key|tok|ghp|gho|xox|hf)[-_]", re.I)
WAIT_S = 4.0  # inside hypothesis' 5 s deadline

methods = st.binary(min_size=1, max_size=12).map(lambda b: bytes(TOKEN[x % len(TOKEN)] for x in b))
methods = methods.filter(lambda m: m.upper() != b"CONNECT")  # a tunnel, not an exchange
paths = st.tuples(
    st.sampled_from([b"/", b"/v1/", b"/v1/chat/completions", b"/v1/models?"]),
    st.lists(st.sampled_from(TARGET_BYTES), max_size=80).map(bytes),
).map(b"".join)
values = (
    st.lists(st.sampled_from(VALUE_BYTES), max_size=60)
    .map(bytes)
    .map(lambda v: v.strip(EDGE_SPACE + b"\r\n"))
    .filter(lambda v: not KEYLIKE.search(v))
)
headers = st.lists(values, max_size=4)
bodies = st.binary(max_size=3000) | st.text(max_size=500).map(str.encode)


@pytest.fixture(scope="module")
def proxy(module_tmp: Path) -> Iterator[InprocProxy]:
    mock = start_mock(module_tmp)
    handle = start_proxy(module_tmp, mock.url, shared=True)
    yield handle
    handle.stop()
    mock.stop()


@pytest.fixture(scope="module")
def recorder():
    server = RawServer(lambda request: [(0.0, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")])
    yield server
    server.close()


@pytest.fixture(scope="module")
def well_formed_ids() -> list[str]:
    return []


def _send(proxy, request: bytes) -> None:
    """Send one request and read its answer's head; the capture is found by its marker header."""
    head = response_head(proxy.port, request, WAIT_S)
    assert head.startswith(b"HTTP/1.1 "), head[:200]


def _fields(head: bytes) -> list[tuple[bytes, bytes]]:
    """(name, value) as HTTP/1.1 reads them: the whitespace around a value is not part of it."""
    fields = []
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon:
            fields.append((name, value.strip(b" \t")))
    return fields


def _find(db: Path, marker: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = conn.execute("select id from exchanges where instr(request_headers, ?) > 0", (marker,)).fetchone()
        finally:
            conn.close()
        if row is not None:
            return str(row[0])
        time.sleep(STORE_POLL_S)
    raise AssertionError(f"no capture holds the request marked {marker}")


def _well_formed(proxy, i: int) -> str:
    body = {"model": "tapfix-mock", "messages": [{"role": "user", "content": f"well-formed {i}"}], "stream": i % 2 == 0}
    with (
        httpx.Client(timeout=WAIT_S) as client,
        client.stream("POST", f"{proxy.url}/v1/chat/completions", json=body) as r,
    ):
        r.read()
        return r.headers["x-tapfix-capture-id"]


@settings(
    max_examples=200,
    deadline=5000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(method=methods, path=paths, values=headers, body=bodies, as_python=st.booleans())
def test_truth_fuzz_capture_path_every_exchange_captured_and_exported_byte_exact(
    proxy, recorder, well_formed_ids, tmp_path_factory, method, path, values, body, as_python
) -> None:
    db = proxy.extra["db"]
    marker = uuid.uuid4().hex
    sent = [(b"x-fuzz-%d" % i, value) for i, value in enumerate(values)] + [(b"x-fuzz-marker", marker.encode())]
    head = method + b" " + path + b" HTTP/1.1\r\nHost: fuzz\r\n"
    head += b"".join(name + b": " + value + b"\r\n" for name, value in sent)
    _send(proxy, head + b"content-length: %d\r\n\r\n" % len(body) + body)
    # A well-formed exchange right behind it: the writer holds it in its batch window while the fuzzed one's
    # repro runs (looked for from the next example on, and all of them by the test after this one).
    well_formed_ids.append(_well_formed(proxy, len(well_formed_ids)))
    capture_id = _find(db, marker)

    conn = open_for_reading(db)
    try:
        capture = load_capture(conn, capture_id)
        assert capture_body(conn, capture, "request") == body
        script = (python_script if as_python else curl_script)(capture, body, "request")
    finally:
        conn.close()
    out = tmp_path_factory.mktemp("repro") / ("repro.py" if as_python else "repro.sh")
    out.write_text(script)
    before = len(recorder.requests)
    run = subprocess.run(
        [sys.executable if as_python else "bash", str(out)],
        env={**os.environ, "TAPFIX_UPSTREAM": recorder.url},
        capture_output=True,
        timeout=WAIT_S,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    resent = recorder.requests[before]
    assert resent.head.split(b" ", 2)[:2] == [method, path]
    assert [h for h in _fields(resent.head) if h[0].startswith(b"x-fuzz-")] == sent, resent.head
    assert resent.body == body
    for earlier in well_formed_ids[-3:-1]:
        assert wait_capture(db, earlier, timeout=WAIT_S)["status"] == 200


def test_truth_fuzz_capture_path_well_formed_traffic_all_there(proxy, well_formed_ids) -> None:
    """After the fuzz: every well-formed exchange sent between its examples is in the store, and the
    writer counted no failure."""
    assert well_formed_ids
    for capture_id in well_formed_ids:
        assert wait_capture(proxy.extra["db"], capture_id, timeout=WAIT_S)["content"]
    writer = httpx.get(f"{proxy.url}/tapfix/health", timeout=WAIT_S).json()["capture_writer"]
    assert writer["failures"] == 0 and not writer["capture_failed"], writer
