"""A broken stream the randomized property run found (tests/test_toolcalls_props.py, local run, not CI's
derandomized examples), kept as its own example until it is fixed: calls first seen on indexes 1 and 2,
then index 0, each cut by the mutation, hand the client arguments of two calls joined under one index.
The same happens at the start of this stop (9cef308): an older bug of the dense re-indexing, not new."""

from __future__ import annotations

import json
import random

import pytest
from tapfix.proxy.toolcalls.chat_stage import ChatToolCallRepair

from tests.support.builders import corrupt_events, random_splits, tool
from tests.support.stage_io import client_view, run_stage

STREAM = b"".join(
    [
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"reasoning_content": ""}, "finish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"reasoning_content": ""}, "finish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"reasoning_content": ""}, "finish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_1", "type": "function", "'
        b'function": {"name": "t1", "arguments": ""}}]}, "finish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": "{"}}]}, "f'
        b'inish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]}, "f'
        b'inish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"tool_calls": [{"index": 2, "id": "call_2", "type": "function", "'
        b'function": {"name": "t2", "arguments": ""}}]}, "finish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"tool_calls": [{"index": 2, "function": {"arguments": "{"}}]}, "f'
        b'inish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_0", "type": "function", "'
        b'function": {"name": "t0", "arguments": ""}}]}, "finish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"tool_calls": [{"index": 2, "function": {"arguments": "\\"_\\": nu"'
        b'}}]}, "finish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}, "f'
        b'inish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"tool_calls": [{"index": 2, "function": {"arguments": "ll}"}}]}, '
        b'"finish_reason": null}]}\n\n',
        b": ping\n\n",
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}, "f'
        b'inish_reason": null}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}\n\n',
        b'data: {"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 7, "model": "m", "choi'
        b'ces": [], "usage": {"total_tokens": 5}}\n\n',
        b"data: [DONE]\n\n",
    ]
)


@pytest.mark.xfail(strict=True, reason="dense re-indexing joins two calls' fragments when index 0 appears last")
def test_a_late_index_0_never_joins_two_calls_arguments():
    rng = random.Random(2367)
    broken = corrupt_events(STREAM, rng)
    stage = ChatToolCallRepair([tool(n) for n in ("t0", "t1", "t2")], policy="error")
    view = client_view(run_stage(stage, random_splits(broken, rng, 50)))
    assert view.errors or all(isinstance(json.loads(c["arguments"]), dict) for c in view.calls)
