"""A broken stream the randomized property run found (tests/unit/test_toolcalls_props.py, local run, not CI's
derandomized examples). The mutation put a call's fragment after [DONE]; the stage let data past [DONE] go
by untouched, so a client that reads on (the AI SDK does) joined it onto a call it held ('{"_": null}{').
Now data after [DONE] goes no further."""

from __future__ import annotations

import json
import random

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


def test_a_fragment_after_done_never_joins_a_held_call():
    rng = random.Random(2367)
    broken = corrupt_events(STREAM, rng)
    stage = ChatToolCallRepair([tool(n) for n in ("t0", "t1", "t2")], policy="error")
    view = client_view(run_stage(stage, random_splits(broken, rng, 50)))
    assert view.errors or all(isinstance(json.loads(c["arguments"]), dict) for c in view.calls)


def test_data_after_done_goes_no_further_and_is_recorded_once():
    """Clients on the AI SDK keep parsing past [DONE]; a call's fragment there would join a call they hold."""
    head = STREAM.split(b"data: [DONE]\n\n")[0] + b"data: [DONE]\n\n"
    late = (
        b'data: {"id": "chatcmpl-p", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 2, "function":'
        b' {"arguments": "{"}}]}, "finish_reason": null}]}\n\n'
    )
    stage = ChatToolCallRepair([tool(n) for n in ("t0", "t1", "t2")], policy="error")
    out = run_stage(stage, [head, late, b": still here\n\n", late])
    view = client_view(out)
    assert view.done == 1 and view.after_done == 0 and view.comments[-1] == b": still here\n\n"
    assert [json.loads(c["arguments"]) for c in view.calls] == [{}, {}, {"_": None}]
    assert [c.kind for c in stage.changes if c.kind == "after_done"] == ["after_done"]
