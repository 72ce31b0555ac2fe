"""Reasoning replay reaches the prompt the real vLLM 0.32 renders (issue 36).

The tiny Qwen3 model's template renders an assistant turn after the last user query as `<think>` + its
reasoning + `</think>`. Turn 1's answer (reasoning and a tool call) comes from a loopback upstream of the
test's own, as the tiny model can't be made to reason on demand; what tapfix forwards on turn 2, and what the
client sent, are both rendered by the real server (`/tokenize`, as a generation renders it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial

import openai
import pytest

from tests.process.vllm.engine import VllmServer
from tests.process.vllm.wire import rendered_prompt
from tests.support.builders import DONE, chat_chunk, sse_event, tool_call_delta
from tests.support.inproc import InprocProxy
from tests.support.rawserver import RawServer, sse_response

pytestmark = [pytest.mark.vllm]

REASONING = "I should read a.py before I change it."
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
FIRST = [{"role": "user", "content": "hi"}]


chunk = partial(chat_chunk, id="c1", model="tiny")
frame = partial(sse_event, ensure_ascii=True, separators=(", ", ": "))  # json.dumps' spacing and escaping, as before


def _answer(request):
    """As vLLM answers a reasoning model: `reasoning` deltas, then a tool call; turn 2: text."""
    if len(json.loads(request.body)["messages"]) == 1:
        chunks = [
            chunk({"role": "assistant", "content": None, "reasoning": REASONING}),
            chunk({"tool_calls": [tool_call_delta(0, "call_1", "read", "{}")]}),
            chunk({}, "tool_calls"),
        ]
    else:
        chunks = [chunk({"role": "assistant", "content": "ok"}), chunk({}, "stop")]
    return sse_response([*map(frame, chunks), DONE])


def test_turn_2_rendered_by_vllm_holds_turn_1s_reasoning_through_tapfix_only(
    vllm: VllmServer, tapfix_in_front: Callable[..., InprocProxy]
) -> None:
    upstream = RawServer(_answer)
    try:
        proxy = tapfix_in_front(upstream, "--engine", "vllm", "--replay-reasoning")
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
        list(client.chat.completions.create(model="tiny", messages=FIRST, tools=TOOLS, stream=True))
        call = {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
        messages = [*FIRST, assistant, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
        list(client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, stream=True))
        forwarded = json.loads(upstream.requests[-1].body)["messages"]
    finally:
        upstream.close()
    assert forwarded[1]["reasoning"] == REASONING
    through = rendered_prompt(vllm, {"messages": forwarded, "tools": TOOLS})
    direct = rendered_prompt(vllm, {"messages": messages, "tools": TOOLS})
    assert "<|im_start|>assistant\n<think>\n" + REASONING + "\n</think>\n\n" in through
    assert REASONING not in direct
