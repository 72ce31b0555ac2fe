"""Issue 37: an agent's next turn is counted by tokenizing only what follows its last prompt (llama.cpp's
`/apply-template` output starts with the earlier one's), and the clamp is the same as a whole count gives.

The upstream speaks llama.cpp's shapes (`/props`, `/apply-template` {"prompt"}, `/tokenize` {"tokens"}:
tools/server/server-context.cpp) with a tokenizer of one token per character, so a sum is checkable."""

from __future__ import annotations

import json

import openai
import orjson
import pytest

from tests.support.inproc import cli, start_proxy
from tests.support.procs import wait_capture
from tests.support.rawserver import RawRequest, RawServer, json_reply

WINDOW = 40_000


def chatml(messages: list[dict]) -> str:
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def _json(obj: object) -> list[tuple[float, bytes]]:
    body = orjson.dumps(obj)
    return [(0.0, json_reply(body))]


def llamacpp(request: RawRequest) -> list[tuple[float, bytes]]:
    if request.path == "/props":
        return _json({"default_generation_settings": {"n_ctx": WINDOW}})
    body = json.loads(request.body) if request.body else {}
    if request.path == "/apply-template":
        return _json({"prompt": chatml(body["messages"])})
    if request.path == "/tokenize":
        return _json({"tokens": list(range(len(body["content"])))})
    message = {"role": "assistant", "content": "Done."}
    return _json({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": message}]})


@pytest.fixture
def upstream():
    server = RawServer(llamacpp)
    yield server
    server.close()


def test_a_next_turn_tokenizes_only_its_new_part(tmp_path, upstream):
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "llamacpp")
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        turn = [{"role": "system", "content": "You are opencode. " * 1000}, {"role": "user", "content": "fix it"}]
        for _ in range(2):
            raw = client.chat.completions.with_raw_response.create(model="m", messages=turn, max_tokens=32_000)
            wait_capture(proxy.extra["db"], raw.headers["x-tapfix-capture-id"])
            sent = json.loads(
                cli(
                    "captures",
                    "export",
                    raw.headers["x-tapfix-capture-id"],
                    "--forwarded",
                    "--db",
                    str(proxy.extra["db"]),
                ).stdout
            )
            assert sent["max_tokens"] == WINDOW - len(chatml(turn))  # the same as a whole count
            turn = turn + [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "now the tests"}]
        tokenized = [json.loads(r.body)["content"] for r in upstream.requests if r.path == "/tokenize"]
        first = chatml(turn[:2])
        assert tokenized == [first, chatml(turn[:4])[len(first) :]]  # the second turn: only its new part
    finally:
        proxy.stop()
