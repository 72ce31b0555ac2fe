"""Issue 15 items 6 and 7: what the store says about streams that end at shutdown, or end normally.

Item 6: SIGTERM with streams open. tapfix stops accepting connections, lets in-flight streams finish
within `--shutdown-grace`, answers a new request on an open connection with a 503 `server_error`, and
ends what is left with the retryable error event. The store holds exactly the bytes each client read,
flagged `proxy_shutdown` (never `upstream_reset` or `client_disconnected`).

Item 7: a client that closes its connection right after the stream's terminal event (the openai SDK
does, after `data: [DONE]`) ended normally. The race is made deterministic: the mock pauses after the
last event, before the chunked terminator, so the close always lands while the proxy still waits.

Every test drives the real proxy in front of the real mock (both in the test process) with a raw socket
client, so the bytes compared with the store are the bytes on the wire. Here "SIGTERM" is the proxy's
`terminate()`, which calls what the signal handler calls (addons/shutdown.py); the real signals (SIGTERM,
a second SIGTERM or Ctrl-C, the exit code) are tests/process/truth/test_shutdown_truth.py's.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.inproc import InprocMock, InprocProxy, cli, start, start_mock, start_proxy
from tests.support.procs import Proc, wait_capture

SCENARIO = {
    "rules": [
        # ~1.5 s: finishes inside the default grace
        {"when": {"model": "brief"}, "do": "answer", "chunk_delay_ms": 150},
        # ~8 s: outlives a short grace
        {"when": {"model": "slow"}, "do": "degenerate", "style": "runaway", "tokens": 40, "chunk_delay_ms": 100},
        # no response head for 10 s: still waiting when a short grace ends
        {"when": {"model": "late"}, "do": "delay_ms", "ms": 10000},
        # the whole answer, then a pause before the chunked terminator (the close-after-[DONE] race)
        {"when": {"model": "linger"}, "do": "stall", "seconds": 1, "after_chunks": 100000},
    ]
}
CUT_FLAGS = {"upstream_reset", "client_disconnected"}


@pytest.fixture(scope="module")
def mock(module_tmp: Path):
    scenario = module_tmp / "shutdown.json"
    scenario.write_text(json.dumps(SCENARIO))
    proc = start_mock(module_tmp, "--scenario", str(scenario))
    yield proc
    proc.stop()


class RawClient:
    """HTTP/1.1 over one socket, read as it arrives: the head, then the de-chunked body."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""
        self.chunked = False
        self.remaining: int | None = None
        self.body = b""

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError(f"closed before a response head: {self.buf!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.remaining = int(headers["content-length"]) if "content-length" in headers else None
        self.body = b""
        return int(lines[0].split()[1]), headers

    def read_until(self, marker: bytes) -> bytes:
        """Body bytes until `marker` has arrived (or the body ends); what was read so far."""
        while marker not in self.body and self._step():
            pass
        return self.body

    def read_all(self) -> bytes:
        while self._step():
            pass
        return self.body

    def _step(self) -> bool:
        """Move one piece of the body from the buffer (reading more when needed); False at its end."""
        if not self.chunked:
            if self.remaining is not None and len(self.body) >= self.remaining:
                return False
            if not self.buf and not self._fill():
                return False
            self.body, self.buf = self.body + self.buf, b""
            return True
        while b"\r\n" not in self.buf:
            if not self._fill():
                return False
        size_line, rest = self.buf.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return False
        while len(rest) < size + 2:
            if not self._fill():
                return False
            rest = self.buf.split(b"\r\n", 1)[1]
        self.body += rest[:size]
        self.buf = rest[size + 2 :]
        return True


def chat(model: str, *, stream: bool = True) -> bytes:
    body = orjson.dumps({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def surface_request(surface: str, model: str) -> bytes:
    path, body = {
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        "responses": ("/v1/responses", {"input": "hi"}),
        "messages": ("/v1/messages", {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}),
    }[surface]
    raw = orjson.dumps({"model": model, "stream": True, **body})
    return b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        path.encode(),
        len(raw),
        raw,
    )


def start_stream(proxy: Proc | InprocProxy, model: str) -> tuple[RawClient, str]:
    """A stream under way: the head and its first event have arrived."""
    client = RawClient(proxy.port)
    client.send(chat(model))
    status, headers = client.head()
    assert status == 200
    client.read_until(b"\n\n")
    return client, headers["x-tapfix-capture-id"]


def refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


def wait_stopped_listening(proxy: Proc | InprocProxy) -> None:
    """The first signal has been handled: the port refuses connections while the process lives on."""
    deadline = time.monotonic() + 10
    while not refused(proxy.port):
        assert time.monotonic() < deadline, "still accepting connections 10 s after SIGTERM"
        time.sleep(0.05)
    assert proxy.alive(), "the proxy exited instead of draining:\n" + proxy.log()


def wait_seen(proxy: Proc | InprocProxy, count: int) -> None:
    """Until /tapfix/health counts `count` exchanges: the recorder has them, so they are in flight."""
    deadline = time.monotonic() + 10
    while httpx.get(f"{proxy.url}/tapfix/health", timeout=5).json()["exchanges"] < count:
        assert time.monotonic() < deadline, "the request never reached the proxy's hooks"
        time.sleep(0.05)


def exit_code(proxy: Proc | InprocProxy) -> int:
    try:
        return proxy.wait(30)
    except TimeoutError:
        raise AssertionError("the proxy did not exit after the grace:\n" + proxy.log()) from None


def stored(db: Path, capture_id: str) -> tuple[dict, bytes]:
    """The row, and what `captures export --client-response` says the client received."""
    row = wait_capture(db, capture_id)
    out = cli("captures", "export", capture_id, "--client-response", "--db", str(db))
    assert out.returncode == 0, out.stderr
    return row, out.stdout


def retryable_error(body: bytes) -> dict:
    """The last `data:` event before [DONE] is tapfix's retryable error; its error object."""
    events = [e for e in body.split(b"\n\n") if e.startswith(b"data: ") and e != b"data: [DONE]"]
    assert body.rstrip().endswith(b"data: [DONE]"), body[-300:]
    error = orjson.loads(events[-1][len(b"data: ") :])["error"]
    assert error["type"] == "server_error", error
    return error


def cut_by_shutdown(proxy: Proc | InprocProxy, capture_id: str, body: bytes) -> tuple[dict, dict]:
    """The stream ended with the retryable error, tapfix exited 0, and the store holds exactly what the
    client read, flagged proxy_shutdown; the error object and the capture's row."""
    error = retryable_error(body)
    assert exit_code(proxy) == 0
    row, client_response = stored(proxy.extra["db"], capture_id)
    assert client_response == body  # exactly what the client read, the error event included
    assert "proxy_shutdown" in json.loads(row["flags"]), row["flags"]
    return error, row


def test_truth_6_the_grace_ends_remaining_streams_with_the_retryable_error(mock: InprocMock, tmp_path: Path) -> None:
    proxy = start_proxy(tmp_path, mock.url, "--shutdown-grace", "1")
    client, capture_id = start_stream(proxy, "slow")
    proxy.terminate()
    wait_stopped_listening(proxy)
    body = client.read_all()
    client.close()
    error, row = cut_by_shutdown(proxy, capture_id, body)
    assert error["tapfix"]["reason"] == "proxy_shutdown"
    flags = set(json.loads(row["flags"]))
    assert "proxy_shutdown" in flags and not flags & CUT_FLAGS, flags
    assert "shut" in (row["error"] or ""), row["error"]


def test_truth_6_a_new_request_on_an_open_connection_gets_503(mock: InprocMock, tmp_path: Path) -> None:
    proxy = start_proxy(tmp_path, mock.url, "--shutdown-grace", "2")
    idle = RawClient(proxy.port)
    idle.send(chat("tapfix-mock", stream=False))
    assert idle.head()[0] == 200
    idle.read_all()  # a keep-alive connection, now idle
    streaming, _ = start_stream(proxy, "slow")
    proxy.terminate()
    wait_stopped_listening(proxy)
    idle.send(chat("tapfix-mock", stream=False))
    status, headers = idle.head()
    body = idle.read_all()
    assert status == 503 and headers.get("connection", "").lower() == "close", (status, headers)
    error = orjson.loads(body)["error"]
    assert error["type"] == "server_error", error
    assert idle.sock.recv(1) == b""  # and the connection is closed
    idle.close()
    streaming.read_all()
    streaming.close()
    assert exit_code(proxy) == 0
    row, client_response = stored(proxy.extra["db"], headers["x-tapfix-capture-id"])
    assert row["status"] == 503 and "proxy_shutdown" in json.loads(row["flags"])
    assert client_response == body


def test_truth_6_a_request_still_waiting_for_its_head_gets_the_json_503(mock: InprocMock, tmp_path: Path) -> None:
    proxy = start_proxy(tmp_path, mock.url, "--shutdown-grace", "1")
    client = RawClient(proxy.port)
    client.send(chat("late"))
    wait_seen(proxy, 1)  # the request is in flight (its upstream answers in 10 s) before the signal
    proxy.terminate()
    status, headers = client.head()
    body = client.read_all()
    client.close()
    assert status == 503 and headers.get("connection", "").lower() == "close", (status, headers)
    assert orjson.loads(body)["error"]["type"] == "server_error"
    assert exit_code(proxy) == 0
    row, client_response = stored(proxy.extra["db"], headers["x-tapfix-capture-id"])
    assert row["status"] == 503 and client_response == body
    flags = set(json.loads(row["flags"]))
    assert "proxy_shutdown" in flags and not flags & (CUT_FLAGS | {"upstream_error"}), flags


def test_the_503_on_messages_is_anthropics_overloaded_error(mock: InprocMock, tmp_path: Path) -> None:
    """Issue 31 items 14 and 15: on /v1/messages the shutdown's 503 is Anthropic's shape (what the anthropic
    SDK and Claude Code read), and the capture says tapfix answered it: the upstream got the request but
    never answered, so the URL stays and no upstream timing or error is recorded."""
    proxy = start_proxy(tmp_path, mock.url, "--shutdown-grace", "1")
    client = RawClient(proxy.port)
    client.send(surface_request("messages", "late"))
    wait_seen(proxy, 1)
    proxy.terminate()
    status, headers = client.head()
    body = client.read_all()
    client.close()
    assert status == 503, (status, headers)
    answer = orjson.loads(body)
    assert answer["type"] == "error" and answer["error"]["type"] == "overloaded_error", answer
    assert "shutting down" in answer["error"]["message"]
    assert exit_code(proxy) == 0
    row, client_response = stored(proxy.extra["db"], headers["x-tapfix-capture-id"])
    assert client_response == body and json.loads(row["error"]) == answer["error"]
    flags = set(json.loads(row["flags"]))
    assert {"proxy_shutdown", "tapfix_answered"} <= flags and "upstream_error" not in flags, flags
    assert row["upstream_url"].startswith(mock.url) and row["upstream_first_byte_ms"] is None


def test_a_client_gone_before_the_response_head_is_a_disconnect(mock: InprocMock, tmp_path: Path) -> None:
    """Not the upstream's fault: flagged client_disconnected, never upstream_error."""
    proxy = start_proxy(tmp_path, mock.url)
    client = RawClient(proxy.port)
    client.send(chat("late"))
    wait_seen(proxy, 1)
    client.close()
    deadline = time.monotonic() + 10
    while True:  # the capture id never reached the client: find the one exchange in the store
        assert time.monotonic() < deadline, "the exchange was not stored"
        out = cli("captures", "list", "--json", "--db", str(proxy.extra["db"]))
        rows = [orjson.loads(line) for line in out.stdout.splitlines() if line.strip()]
        if rows:
            break
        time.sleep(0.1)
    proxy.stop()
    assert "client_disconnected" in rows[0]["flags"] and "upstream_error" not in rows[0]["flags"], rows[0]


def test_truth_6_config_shutdown_grace_0_ends_at_once(mock: InprocMock, tmp_path: Path) -> None:
    config = tmp_path / "tapfix.toml"
    config.write_text(
        f'shutdown_grace = 0\n\n[upstreams.mock]\nbase_url = "{mock.url}"\nengine = "vllm"\n\n[models.slow]\n'
    )
    proxy = start_proxy_config(tmp_path, config)
    client, capture_id = start_stream(proxy, "slow")
    proxy.terminate()
    body = client.read_all()
    client.close()
    cut_by_shutdown(proxy, capture_id, body)


def start_proxy_config(tmp_path: Path, config: Path) -> InprocProxy:
    db = tmp_path / "config.db"
    handle = start(["--config", str(config), "--db", str(db)], tmp_path / "proxy-config.log")
    handle.extra["db"] = db
    return handle


# -- item 7 ---------------------------------------------------------------------------------------
TERMINAL = {"chat": b"data: [DONE]", "responses": b"event: response.completed", "messages": b"event: message_stop"}


@pytest.fixture(scope="module")
def proxy7(module_tmp: Path, mock: InprocMock):
    proc = start_proxy(module_tmp, mock.url, db=module_tmp / "item7.db", shared=True)
    yield proc
    proc.stop()


def close_after(proxy: Proc | InprocProxy, surface: str, marker: bytes, model: str = "linger") -> str:
    """Read until `marker` and its event's end have arrived, then close at once (as the openai SDK does)."""
    client = RawClient(proxy.port)
    client.send(surface_request(surface, model))
    status, headers = client.head()
    assert status == 200
    body = client.read_until(marker)
    while marker in body and not body[body.index(marker) :].endswith(b"\n\n"):
        body = client.read_until(body[body.index(marker) :] + b"\n\n")
    client.close()
    return headers["x-tapfix-capture-id"]


@pytest.mark.parametrize("surface", sorted(TERMINAL))
def test_truth_7_a_close_right_after_the_terminal_event_is_a_normal_end(proxy7: InprocProxy, surface: str) -> None:
    ids = [close_after(proxy7, surface, TERMINAL[surface]) for _ in range(3)]
    for capture_id in ids:
        row = wait_capture(proxy7.extra["db"], capture_id)
        flags = set(json.loads(row["flags"]))
        assert "client_disconnected" not in flags and row["error"] is None, (flags, row["error"])
        assert row["status"] == 200


def test_a_close_before_the_terminal_event_is_still_a_disconnect(proxy7: InprocProxy) -> None:
    capture_id = close_after(proxy7, "chat", b'"finish_reason":null', model="slow")  # 8 s to go
    row = wait_capture(proxy7.extra["db"], capture_id)
    assert "client_disconnected" in json.loads(row["flags"]) and row["error"]
