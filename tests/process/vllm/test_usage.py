"""Issue 37 against the real vLLM: a streamed chat request without `stream_options.include_usage` is sent
with it, the capture gets vLLM's usage, and the client gets the stream vLLM writes without the option: no
usage chunk, and `system_fingerprint` (which vLLM moves onto the usage chunk when there is one) back at the
end of the last choice chunk. What vLLM really sent is recorded by the loopback relay between tapfix and it.
The checks are the llama-server suite's too (tests/process/engine_suite.py)."""

from __future__ import annotations

import pytest

from tests.process.engine_suite import (
    check_a_client_that_asked_gets_the_engines_bytes,
    check_usage_asked_for_and_kept_from_the_client,
    relayed,
)
from tests.process.vllm.wire import chat_body

pytestmark = [pytest.mark.vllm]

STREAM_HI = chat_body([{"role": "user", "content": "hi"}], stream=True, chat_template_kwargs={"enable_thinking": False})

relay, proxy = relayed("vllm", "--engine", "vllm")


def test_the_client_gets_the_stream_without_usage_and_the_capture_the_usage(proxy, relay):
    check_usage_asked_for_and_kept_from_the_client(proxy, relay, STREAM_HI, moved="system_fingerprint", timeout=120)


def test_a_client_that_asked_gets_vllms_bytes(proxy, relay):
    check_a_client_that_asked_gets_the_engines_bytes(proxy, relay, STREAM_HI, timeout=120)
