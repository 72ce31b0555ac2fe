"""Reasoning replay reaches the prompt the real llama-server renders (issue 36).

Qwen3's template (`Qwen-Qwen3-0.6B.jinja`, from the llama-cpp-python sdist the build came from) renders an
assistant turn after the last user query as `<think>\\n` + `reasoning_content` + `\\n</think>`, so the
prompt shows whether the turn's reasoning arrived where llama.cpp reads it. Turn 1's answer (reasoning and
a tool call) comes from a loopback upstream of the test's own, as the tiny model can't be made to reason on
demand; what tapfix forwards on turn 2, and what the client sent, are both rendered by the real server's
`/apply-template`.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest

from tests.process.realengine.engine import Build, LlamaServer
from tests.support.builders import DONE, chat_chunk, sse_event, tool_call_delta
from tests.support.ci import unavailable
from tests.support.inproc import InprocProxy
from tests.support.rawserver import RawServer, sse_response

pytestmark = [pytest.mark.realengine]

QWEN3_TEMPLATE = "Qwen-Qwen3-0.6B.jinja"
REASONING = "The user wants a.py read. I will call read with path a.py."
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
FIRST = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "read a.py"}]


def _qwen3_template(build: Build, tmp: Path) -> Path:
    """The template out of the sdist scripts/build-llama-server downloaded (its templates/ holds others)."""
    for tarball in sorted((build.dir.parent / "sdist").glob("llama_cpp_python-*.tar.gz")):
        with tarfile.open(tarball) as archive:
            member = next(
                (m for m in archive.getmembers() if m.name.endswith(f"models/templates/{QWEN3_TEMPLATE}")), None
            )
            if member is not None and (source := archive.extractfile(member)) is not None:
                path = tmp / QWEN3_TEMPLATE
                path.write_bytes(source.read())
                return path
    unavailable(f"real-engine suite: no {QWEN3_TEMPLATE} in the llama-cpp-python sdist under {build.dir.parent}")
    raise AssertionError  # unavailable() skips or fails


chunk = partial(chat_chunk, id="c1", model="tiny")
frame = partial(sse_event, ensure_ascii=True, separators=(", ", ": "))  # json.dumps' spacing and escaping, as before


def _answer(request):
    """As llama-server answers a reasoning model: `reasoning_content`, then a tool call; turn 2: text."""
    if len(json.loads(request.body)["messages"]) == 2:
        chunks = [
            chunk({"role": "assistant", "content": None, "reasoning_content": REASONING}),
            chunk({"tool_calls": [tool_call_delta(0, "call_1", "read", "")]}),
            chunk({"tool_calls": [tool_call_delta(0, arguments='{"path":"a.py"}')]}),
            chunk({}, "tool_calls"),
        ]
    else:
        chunks = [chunk({"role": "assistant", "content": "It prints 1."}), chunk({}, "stop")]
    return sse_response([*map(frame, chunks), DONE])


@pytest.fixture(scope="module")
def qwen3_llama(llama_server: Callable[..., LlamaServer], llama_build: Build, tmp_path_factory) -> LlamaServer:
    template = _qwen3_template(llama_build, tmp_path_factory.mktemp("qwen3"))
    return llama_server("--chat-template-file", str(template))


def _rendered(server: LlamaServer, messages: list[dict]) -> str:
    response = httpx.post(server.url + "/apply-template", json={"messages": messages, "tools": TOOLS}, timeout=30)
    response.raise_for_status()
    return str(response.json()["prompt"])


def test_turn_2_rendered_by_llama_server_holds_turn_1s_reasoning_through_tapfix_only(
    qwen3_llama: LlamaServer, tapfix_in_front: Callable[..., InprocProxy]
):
    upstream = RawServer(_answer)
    try:
        proxy = tapfix_in_front(upstream, "--engine", "llamacpp", "--replay-reasoning")  # type: ignore[arg-type]
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
        calls: dict[int, dict] = {}
        for chunk in client.chat.completions.create(model="tiny", messages=FIRST, tools=TOOLS, stream=True):
            for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                slot = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
        call = calls[0]
        assistant = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call["id"], "type": "function", "function": {k: call[k] for k in ("name", "arguments")}}
            ],
        }
        messages = [*FIRST, assistant, {"role": "tool", "tool_call_id": call["id"], "content": "print(1)"}]
        list(client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, stream=True))
        forwarded = json.loads(upstream.requests[-1].body)["messages"]
    finally:
        upstream.close()

    direct, through = _rendered(qwen3_llama, messages), _rendered(qwen3_llama, forwarded)
    assert "<think>\n" + REASONING + "\n</think>" in through
    assert REASONING not in direct
    assert through.replace("<think>\n" + REASONING + "\n</think>\n\n", "") == direct  # nothing else differs
