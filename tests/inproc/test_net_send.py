"""A request sent over a kept-alive connection the upstream closed without answering goes out once more.

llama-server does this after every streamed response (tapfix.proxy.net.send); the scripted upstream here
closes the connection on a chosen request, read but unanswered, so each case is exact rather than a race.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from tapfix.proxy import net

from tests.inproc.test_replay import json_rows, run_replay, store_source
from tests.support.rawserver import RawRequest, RawServer, Script

SSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 14\r\n"
    b"keep-alive: timeout=5\r\n\r\ndata: [DONE]\n\n"
)


def closing_on(which: Callable[[int], bool]) -> Callable[[RawRequest], Script]:
    """Answers each request, except those whose number (1-based, over all connections) `which` picks:
    those it reads and then closes the connection on."""
    count = [0]

    def respond(_: RawRequest) -> Script:
        count[0] += 1
        return [(0.0, b"<CLOSE>")] if which(count[0]) else [(0.0, SSE)]

    return respond


@pytest.fixture
def upstream(request: pytest.FixtureRequest) -> Iterator[RawServer]:
    server = RawServer(closing_on(request.param))
    yield server
    server.close()


async def two_requests(url: str, send: Callable[[httpx.AsyncClient, httpx.Request], object]) -> list[int]:
    async with httpx.AsyncClient(timeout=10) as client:
        statuses = []
        for _ in range(2):
            response = await send(client, client.build_request("POST", url, content=b"{}"))  # type: ignore[misc]
            await response.aread()
            statuses.append(response.status_code)
        return statuses


@pytest.mark.parametrize("upstream", [lambda n: n == 2], indirect=True)
def test_without_it_the_second_request_gets_no_answer(upstream: RawServer):
    """The server's behaviour the module exists for: httpx alone fails the reused connection's request."""
    with pytest.raises(httpx.RemoteProtocolError):
        asyncio.run(two_requests(upstream.url, lambda c, r: c.send(r, stream=True)))


@pytest.mark.parametrize("upstream", [lambda n: n == 2], indirect=True)
def test_the_unanswered_request_goes_out_once_more_on_a_new_connection(upstream: RawServer):
    assert asyncio.run(two_requests(upstream.url, net.send)) == [200, 200]
    assert upstream.served == [2, 1]  # the closed connection read two, the new one the resend


@pytest.mark.parametrize("upstream", [lambda n: n >= 2], indirect=True)
def test_a_second_close_is_the_servers_and_is_reported(upstream: RawServer):
    with pytest.raises(httpx.RemoteProtocolError):
        asyncio.run(two_requests(upstream.url, net.send))
    assert upstream.served == [2, 1]  # one more, not a loop


@pytest.mark.parametrize("upstream", [lambda n: n % 2 == 0], indirect=True)
def test_replay_runs_all_answer_where_the_upstream_closes_after_each(tmp_path: Path, upstream: RawServer):
    """`tapfix replay --times 4` one run after another over one kept-alive connection, to an upstream that
    closes it after every answer: every run is answered (it failed one run in two before)."""
    db = tmp_path / "c.db"
    source = store_source(db, upstream.url)
    result = run_replay(source, "--db", str(db), "--times", "4", "--json")
    assert result.exit_code == 0, result.output
    runs = json_rows(result.output)
    assert [r["status"] for r in runs] == [200] * 4, json.dumps(runs)
