"""Issue 37 against the real vLLM: a streamed chat request without `stream_options.include_usage` is sent
with it, the capture gets vLLM's usage, and the client gets the stream vLLM writes without the option: no
usage chunk, and `system_fingerprint` (which vLLM moves onto the usage chunk when there is one) back at the
end of the last choice chunk. What vLLM really sent is recorded by the loopback relay between tapfix and it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from tests.process.realengine.relay import Relay, chat_stream_through, split_events
from tests.process.vllm.engine import VllmServer
from tests.process.vllm.wire import chat_body
from tests.support.inproc import InprocProxy
from tests.support.procs import wait_capture

pytestmark = [pytest.mark.vllm]

HI = [{"role": "user", "content": "hi"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def relay(vllm: VllmServer) -> Iterator[Relay]:
    witness = Relay(vllm.port)
    yield witness
    witness.close()


@pytest.fixture(scope="module")
def proxy(tapfix_in_front: Callable[..., InprocProxy], relay: Relay) -> InprocProxy:
    return tapfix_in_front(relay, "--engine", "vllm")


def stream(proxy: InprocProxy, relay: Relay, **extra: object) -> tuple[bytes, str, bytes, dict]:
    return chat_stream_through(proxy.url, relay, chat_body(HI, stream=True, **NO_THINKING) | extra, timeout=120)


events = split_events


def test_the_client_gets_the_stream_without_usage_and_the_capture_the_usage(proxy, relay):
    received, capture_id, server, forwarded = stream(proxy, relay)
    assert forwarded["stream_options"] == {"include_usage": True}
    got, sent = events(received), events(server)
    usage = json.loads(sent[-2][6:])
    assert usage["choices"] == [] and "system_fingerprint" in usage  # vLLM's own answer to the option
    assert got[:-2] == sent[:-3] and got[-1] == sent[-1] == b"data: [DONE]\n\n"  # the rest: the same bytes
    last = json.loads(got[-2][6:])
    assert list(last) == [*json.loads(sent[-3][6:]), "system_fingerprint"]  # where vLLM writes it without
    assert last["system_fingerprint"] == usage["system_fingerprint"]
    row = wait_capture(proxy.extra["db"], capture_id)
    assert row["prompt_tokens"] == usage["usage"]["prompt_tokens"] > 0


def test_a_client_that_asked_gets_vllms_bytes(proxy, relay):
    received, _, server, forwarded = stream(proxy, relay, stream_options={"include_usage": True})
    assert received == server and forwarded["stream_options"] == {"include_usage": True}
