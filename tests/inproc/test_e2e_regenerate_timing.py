"""Issue 19 end to end, the relay's timing: `tapfix run --regenerate 1` in front of `tapfix mock`, the first
attempt's tool call broken and the second attempt's headers late. Ports the spike's concurrency_check.py
(keep-alives reach the waiting client while other clients are served) and disconnect_check.py (a client
that leaves while attempt 2 is awaited lets go of it, and tapfix keeps serving).

The relay's keep-alive interval (addons.KEEPALIVE_S, 5 s) is 1 s here (tests/support/keepalive.py), and attempt 2
is delayed past it by the same margins as past the real one."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.inproc.test_e2e_regenerate import WRITE, rows
from tests.support.inproc import InprocMock, InprocProxy, start_mock, start_proxy
from tests.support.keepalive import TEST_KEEPALIVE_S as KEEPALIVE_S
from tests.support.keepalive import keepalive_every
from tests.support.procs import wait_capture
from tests.support.stage_io import client_view

SLOW_MODEL = "m"  # only this model's tool conversations are broken, then slow; any other is healthy


def slow_second_attempt(delay_s: float) -> dict[str, Any]:
    """Attempt 1 broken (unrecoverable), attempt 2 healthy after `delay_s` before its headers, attempt 3 a
    418: asking the mock the same conversation afterwards tells whether attempt 2 reached it."""
    when = {"has_tools": True, "model": SLOW_MODEL}
    return {
        "rules": [
            {"when": {**when, "attempt": 1}, "do": "break_tool_call", "mode": "truncate"},
            {"when": {**when, "attempt": 2}, "do": "delay_ms", "ms": int(delay_s * 1000)},
            {"when": {**when, "attempt": 3}, "do": "http_error", "status": 418},
        ]
    }


@pytest.fixture
def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[InprocMock, InprocProxy]]:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(slow_second_attempt(request.param)))
    with keepalive_every(KEEPALIVE_S):
        mock = start_mock(tmp_path, "--scenario", str(path))
        proxy = start_proxy(tmp_path, mock.url, "--regenerate", "1")
        try:
            yield proxy, mock
        finally:
            proxy.stop()
            mock.stop()


def tool_body(model: str = SLOW_MODEL, text: str = "Create a file hello.txt containing a greeting") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "tools": [WRITE], "stream": True}


def plain_body() -> dict[str, Any]:
    return {"model": "other", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}


def connections_to(port: int) -> set[str]:
    """The local ends of established TCP connections on this host to `port` (the clients' side): how the
    mock's open requests show from outside, since it counts nothing itself."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
            found.add(fields[1])
    return found


def assert_served(proxy: InprocProxy) -> None:
    """A plain request and a relayed tool request from other clients both complete, quickly."""
    started = time.monotonic()
    plain = httpx.post(proxy.url + "/v1/chat/completions", json=plain_body(), timeout=5)
    assert plain.status_code == 200 and "42" in plain.json()["choices"][0]["message"]["content"]
    relayed = httpx.post(proxy.url + "/v1/chat/completions", json=tool_body("healthy"), timeout=5)
    view = client_view(relayed.content)
    assert relayed.status_code == 200 and view.errors == [] and len(view.calls) == 1
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("stack", [KEEPALIVE_S + 1.5], indirect=True)
def test_keep_alives_reach_the_waiting_client_and_others_are_served_meanwhile(
    stack: tuple[InprocMock, InprocProxy],
) -> None:
    proxy, _ = stack
    lines: list[tuple[float, str]] = []
    raw = bytearray()
    keepalive = threading.Event()
    failure: list[BaseException] = []

    def waiting_client() -> None:
        try:
            with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=tool_body(), timeout=30) as r:
                for data in r.iter_raw():
                    raw.extend(data)
                    for line in data.decode().splitlines():
                        lines.append((time.monotonic(), line))
                        if line.startswith(": keep-alive"):
                            keepalive.set()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failure.append(e)
            keepalive.set()

    t0 = time.monotonic()
    client = threading.Thread(target=waiting_client)
    client.start()
    try:
        assert keepalive.wait(KEEPALIVE_S + 5), "no keep-alive while attempt 2 was awaited"
        assert not failure, failure
        assert_served(proxy)  # while attempt 2's headers are still a second away
        others_done = time.monotonic()
    finally:
        client.join(30)
    assert not failure, failure
    first_call = next(t for t, line in lines if '"tool_calls"' in line)
    assert others_done < first_call, "the other clients were served while the first one waited"
    assert first_call - t0 >= KEEPALIVE_S + 1.0, "attempt 2's call came after its delay"
    keepalives = [t for t, line in lines if line.startswith(": keep-alive")]
    assert keepalives and all(t < first_call for t in keepalives)
    view = client_view(bytes(raw))
    assert view.errors == [] and view.done == 1 and len(view.calls) == 1
    assert view.calls[0]["name"] == "write"
    assert set(json.loads(view.calls[0]["arguments"])) >= {"content", "filePath"}


LEAVE_DELAY_S = (
    2 * KEEPALIVE_S + 4
)  # attempt 2's headers this late: the mock is still silent ~K + 4 s after the client left


def leave_at_the_first_keep_alive(proxy: InprocProxy) -> str:
    """Stream a broken-then-slow request and hang up once a keep-alive shows attempt 2 is awaited."""
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=tool_body(), timeout=30) as r:
        capture_id = r.headers["x-tapfix-capture-id"]
        for line in r.iter_lines():
            assert '"tool_calls"' not in line and "[DONE]" not in line, line
            if line.startswith(": keep-alive"):
                return capture_id
    raise AssertionError("the stream ended without a keep-alive")


@pytest.mark.parametrize("stack", [LEAVE_DELAY_S], indirect=True)
def test_a_client_leaving_during_attempt_2_is_recorded_and_tapfix_keeps_serving(
    stack: tuple[InprocMock, InprocProxy],
) -> None:
    proxy, mock = stack
    capture_id = leave_at_the_first_keep_alive(proxy)
    assert len(connections_to(mock.port)) == 1, "attempt 2's request is open at the mock"
    assert_served(proxy)

    found = rows(proxy.extra["db"], capture_id, 2)
    assert [(r["attempt"], r["attempt_of"]) for r in found] == [(1, None), (2, capture_id)]
    parent, second = found
    assert {"client_disconnected", "regenerated"} <= set(json.loads(parent["flags"])), parent["flags"]
    assert second["status"] is None, "attempt 2 never had an answer"
    cancelled = set(json.loads(second["flags"]))
    assert "client_disconnected" in cancelled and "upstream_error" not in cancelled, "cancelled: no upstream error"

    again = httpx.post(mock.url + "/v1/chat/completions", json=tool_body(), timeout=5)
    assert again.status_code == 418, "the mock saw attempt 2 (this is the conversation's third ask)"


@pytest.mark.parametrize("stack", [LEAVE_DELAY_S], indirect=True)
def test_a_client_leaving_during_attempt_2_cancels_it_at_once(stack: tuple[InprocMock, InprocProxy]) -> None:
    proxy, mock = stack
    capture_id = leave_at_the_first_keep_alive(proxy)
    left = time.monotonic()
    pending = connections_to(mock.port)  # attempt 2's request, the only one open now
    assert len(pending) == 1
    deadline = left + 2.0  # the relay looks for the close every 0.2 s; room for a loaded host
    while pending & connections_to(mock.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pending & connections_to(mock.port), "attempt 2's upstream request still open after the client left"
    assert time.monotonic() - left < LEAVE_DELAY_S - KEEPALIVE_S, "closed by the relay, not by the mock's answer"
    wait_capture(proxy.extra["db"], capture_id)
