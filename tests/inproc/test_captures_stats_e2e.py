"""`tapfix captures stats` over traffic that went through the real proxy (issue 38): the OpenAI SDK and an
opencode-like client (httpx, its User-Agent, streamed with `include_usage`) against a loopback upstream
that answers each request with usage of its own; the report by client sums to what the upstream reported."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.support.builders import DONE, chat_chunk, sse_event
from tests.support.inproc import cli, start_proxy
from tests.support.procs import wait_capture
from tests.support.rawserver import RawRequest, RawServer, json_reply, sse_response

OPENCODE = "opencode/0.4.1 ai-sdk/provider-utils/2.2.8 runtime/bun/1.2.19"


def test_stats_by_client_sum_to_what_the_upstream_reported(tmp_path: Path) -> None:
    counter = itertools.count(1)
    sent: list[tuple[bool, dict[str, Any]]] = []  # (streamed, the usage the upstream reported)

    def answer(request: RawRequest) -> list[tuple[float, bytes]]:
        if request.path == "/v1/models":  # the proxy's start-up preflight: no chat, no usage, no capture
            return [(0.0, json_reply(b'{"object":"list","data":[{"id":"m","object":"model"}]}'))]
        n = next(counter)
        usage: dict[str, Any] = {
            "prompt_tokens": 1000 * n,
            "completion_tokens": 10 * n,
            "total_tokens": 1010 * n,
            "prompt_tokens_details": {"cached_tokens": 100 * n},
            "completion_tokens_details": {"reasoning_tokens": n},
        }
        streamed = b'"stream":true' in request.body.replace(b" ", b"")
        sent.append((streamed, usage))
        if streamed:
            events = [chat_chunk({"role": "assistant", "content": "hi"}), chat_chunk(finish_reason="stop")]
            events.append(chat_chunk(id="c", created=None) | {"choices": [], "usage": usage})
            return sse_response([*map(sse_event, events), DONE])
        body = json.dumps(
            {
                "id": f"c{n}",
                "object": "chat.completion",
                "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": usage,
            }
        ).encode()
        return [(0.0, json_reply(body))]

    server = RawServer(answer)
    proxy = start_proxy(tmp_path, f"http://127.0.0.1:{server.port}")
    db = proxy.extra["db"]
    clients: dict[str, str] = {}
    try:
        sdk = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0, timeout=20)
        for _ in range(3):
            raw = sdk.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "go"}])
            clients[raw.headers["x-tapfix-capture-id"]] = "OpenAI/Python"
        with httpx.Client(base_url=proxy.url, headers={"user-agent": OPENCODE}, timeout=20) as http:
            for _ in range(2):
                body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "messages": []}
                body["messages"] = [{"role": "user", "content": "go"}]
                with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    r.read()
                    clients[r.headers["x-tapfix-capture-id"]] = "opencode"
        for capture_id in clients:
            wait_capture(db, capture_id)
    finally:
        proxy.stop()
        server.close()
    assert len(sent) == 5
    expected: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for streamed, usage in sent:
        group = expected["opencode" if streamed else "OpenAI/Python"]  # only opencode's requests stream
        group["requests"] += 1
        group["input_tokens"] += usage["prompt_tokens"]
        group["cached_input_tokens"] += usage["prompt_tokens_details"]["cached_tokens"]
        group["output_tokens"] += usage["completion_tokens"]
        group["reasoning_tokens"] += usage["completion_tokens_details"]["reasoning_tokens"]
    out = cli("captures", "stats", "--db", str(db), "--by", "client,upstream", "--json").stdout
    groups = {g["client"]: g for g in map(json.loads, out.splitlines())}
    assert set(groups) == {"OpenAI/Python", "opencode"}
    for client, want in expected.items():
        got = groups[client]
        assert got["upstream"] == f"127.0.0.1:{server.port}"
        assert {key: got[key] for key in want} == want
        assert got["errors"] == 0 and got["attempts"] == 0
    assert groups["opencode"]["ttft_ms_p50"] is not None  # streamed: a first token was timed
