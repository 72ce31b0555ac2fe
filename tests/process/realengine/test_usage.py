"""Issue 37 against the real llama-server: a streamed chat request without `stream_options.include_usage`
is sent with it, the capture gets llama-server's usage, and the client gets the stream llama-server writes
without the option: no usage chunk, and `timings` (which llama-server adds last to the stream's last chunk,
the usage chunk when there is one: tools/server/server-task.cpp) back on the last choice chunk, last.
What llama-server really sent is recorded by the loopback relay between tapfix and it. The checks are the
vLLM suite's too (tests/process/engine_suite.py)."""

from __future__ import annotations

import pytest

from tests.process.engine_suite import (
    check_a_client_that_asked_gets_the_engines_bytes,
    check_usage_asked_for_and_kept_from_the_client,
    relayed,
)

pytestmark = [pytest.mark.realengine]

STREAM_HI = {"messages": [{"role": "user", "content": "hi"}], "stream": True}

relay, proxy = relayed("llama", "--engine", "llamacpp")


def test_the_client_gets_the_stream_without_usage_and_the_capture_the_usage(proxy, relay):
    check_usage_asked_for_and_kept_from_the_client(proxy, relay, STREAM_HI, moved="timings")


def test_a_client_that_asked_gets_llama_servers_bytes(proxy, relay):
    check_a_client_that_asked_gets_the_engines_bytes(proxy, relay, STREAM_HI)
