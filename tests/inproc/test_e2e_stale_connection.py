"""An upstream that closes a kept-alive connection just as tapfix sends the next request on it.

Engines close idle keep-alive connections (llama-server after 5 s; many after an error answer), and the close
can cross the next request on the wire: the request went out on a connection the upstream had already given
up, and no answer comes. An HTTP client sends such a request again on a new connection (nothing was
answered, and the connection was reused, so the close says nothing about the request). Through tapfix the
client's own connection is still open and healthy, so tapfix must do the same, once, instead of answering
502 "server closed connection" (seen in CI: `tapfix probe` through tapfix failed a check it passed directly).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
import pytest
from tapfix.addons.stale_connection import REASON

from tests.support.inproc import start_proxy
from tests.support.procs import wait_capture
from tests.support.rawserver import RawRequest, RawServer, json_reply, sse_response

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM_EVENTS = [
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n',
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]


def closing_second_request(answer):
    """Answers each request with `answer`, except the second one on a connection: closed unanswered."""
    seen: dict[int, int] = {}

    def respond(request: RawRequest):
        connection = len(server.served) - 1
        seen[connection] = seen.get(connection, 0) + 1
        return [(0.0, b"<CLOSE>")] if seen[connection] == 2 else answer(request)

    server = RawServer(respond)
    return server


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_request_the_upstream_closed_a_reused_connection_on_is_sent_again_on_a_new_one(
    tmp_path: Path, stream: bool
) -> None:
    def answer(_: RawRequest):
        return sse_response(STREAM_EVENTS) if stream else [(0.0, json_reply(b'{"choices":[]}'))]

    server = closing_second_request(answer)
    proxy = start_proxy(tmp_path, server.url)
    try:
        with httpx.Client(base_url=proxy.url, timeout=10) as client:  # one kept-alive connection to tapfix
            first = client.post("/v1/chat/completions", json={**BODY, "stream": stream})
            second = client.post("/v1/chat/completions", json={**BODY, "stream": stream})
        assert first.status_code == 200, first.text
        assert second.status_code == 200, second.text
        if stream:
            assert "Hello" in second.text and second.text.rstrip().endswith("data: [DONE]")
        # The upstream got the second request twice: on the old connection, then alone on a new one (a
        # connection tapfix opened without a request, if any, aside).
        assert [n for n in server.served if n] == [2, 1], server.served
        assert [json.loads(r.body)["messages"] for r in server.requests] == [BODY["messages"]] * 3
        capture_id = second.headers["x-tapfix-capture-id"]
        capture = wait_capture(proxy.extra["db"], capture_id)
        assert capture["status"] == 200
        with sqlite3.connect(f"file:{proxy.extra['db']}?mode=ro", uri=True) as conn:
            changes = conn.execute("select stage, kind, reason from changes where exchange_id = ?", (capture_id,))
            assert ("router", "resend", REASON) in changes.fetchall()
    finally:
        proxy.stop()
        server.close()


def test_a_new_connection_the_upstream_closes_unanswered_is_not_sent_again(tmp_path: Path) -> None:
    """Only a reused connection's close is the race: on a new connection it is the upstream's answer to the
    request, and the client gets tapfix's retryable error at once (no second try)."""
    server = RawServer(lambda _: [(0.0, b"<CLOSE>")])
    proxy = start_proxy(tmp_path, server.url)
    try:
        answer = httpx.post(f"{proxy.url}/v1/chat/completions", json=BODY, timeout=10)
        assert answer.status_code == 502
        assert [n for n in server.served if n] == [1]
    finally:
        proxy.stop()
        server.close()
