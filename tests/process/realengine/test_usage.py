"""Issue 37 against the real llama-server: a streamed chat request without `stream_options.include_usage`
is sent with it, the capture gets llama-server's usage, and the client gets the stream llama-server writes
without the option: no usage chunk, and `timings` (which llama-server adds last to the stream's last chunk,
the usage chunk when there is one: tools/server/server-task.cpp) back on the last choice chunk, last.
What llama-server really sent is recorded by the loopback relay between tapfix and it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from tests.process.realengine.engine import LlamaServer
from tests.process.realengine.relay import Relay, chat_stream_through, split_events
from tests.support.inproc import InprocProxy
from tests.support.procs import wait_capture

pytestmark = [pytest.mark.realengine]

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def relay(llama: LlamaServer) -> Iterator[Relay]:
    witness = Relay(llama.port)
    yield witness
    witness.close()


@pytest.fixture(scope="module")
def proxy(tapfix_in_front: Callable[..., InprocProxy], relay: Relay) -> InprocProxy:
    return tapfix_in_front(relay, "--engine", "llamacpp")


def stream(proxy: InprocProxy, relay: Relay, **extra: object) -> tuple[bytes, str, bytes, dict]:
    return chat_stream_through(proxy.url, relay, {"messages": HI, "stream": True} | extra)


events = split_events


def test_the_client_gets_the_stream_without_usage_and_the_capture_the_usage(proxy, relay):
    received, capture_id, server, forwarded = stream(proxy, relay)
    assert forwarded["stream_options"] == {"include_usage": True}
    usage_event = events(server)[-2]
    usage = json.loads(usage_event[6:])
    assert usage["choices"] == [] and "timings" in usage  # llama-server's own answer to the option
    got, sent = events(received), events(server)
    assert got[:-2] == sent[:-3] and got[-1] == sent[-1] == b"data: [DONE]\n\n"  # the rest: the same bytes
    last = json.loads(got[-2][6:])
    assert last == json.loads(sent[-3][6:]) | {"timings": usage["timings"]}
    assert list(last) == [*json.loads(sent[-3][6:]), "timings"]  # where llama-server writes it without the option
    row = wait_capture(proxy.extra["db"], capture_id)
    assert row["prompt_tokens"] == usage["usage"]["prompt_tokens"] > 0
    assert row["completion_tokens"] == usage["usage"]["completion_tokens"]


def test_a_client_that_asked_gets_llama_servers_bytes(proxy, relay):
    received, _, server, forwarded = stream(proxy, relay, stream_options={"include_usage": True})
    assert received == server and forwarded["stream_options"] == {"include_usage": True}
