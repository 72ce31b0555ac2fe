"""One finish per choice (issue 31 item 11; docs/repair.md, "Finish reason"), both ways, with hostile splits.

A server that sends a second finish chunk after `finish_reason: "tool_calls"` (a trailing `stop`) loses the
calls for a client that keeps the last finish it read. The client gets the choice's first finish (the
one that keeps the calls, after the repair); the later one leaves its chunk, which goes on when it carries
anything else. A stream with one finish per choice passes byte for byte; calls that go out after a
text finish end with their own.
"""

from __future__ import annotations

import random
from functools import partial
from typing import Any

import pytest
from tapfix.proxy.toolcalls import ChatToolCallRepair

from tests.support.builders import chat_chunk, named_event, random_splits, sse, sse_json, tool, tool_call_chunk
from tests.support.stage_io import client_view, run_stage

TOOLS = [tool("bash", {"command": {"type": "string"}}, ["command"])]
chunk = partial(chat_chunk, id="chatcmpl-fin")
call = partial(tool_call_chunk, chunk_id="chatcmpl-fin")
ROLE = chunk({"role": "assistant", "content": ""})
LS = [call(0, "call_a", "bash", ""), call(0, arguments='{"command": "ls"}')]
USAGE = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
SEEDS = [0, 1, 2, 3]


def run(stream: list[dict[str, Any]], seed: int) -> tuple[bytes, bytes, ChatToolCallRepair]:
    data = sse(stream)
    stage = ChatToolCallRepair(TOOLS, capture_id="cap-fin")
    return data, run_stage(stage, random_splits(data, random.Random(seed))), stage


def finishes(out: bytes) -> list[tuple[int, str]]:
    return [
        (ch["index"], ch["finish_reason"])
        for c in client_view(out).chunks
        for ch in c.get("choices") or []
        if ch.get("finish_reason")
    ]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("trailing", ["stop", "tool_calls", "length"])
def test_a_finish_after_the_calls_finish_is_dropped(trailing: str, seed: int) -> None:
    _, out, stage = run([ROLE, *LS, chunk(finish_reason="tool_calls"), chunk(finish_reason=trailing)], seed)
    assert finishes(out) == [(0, "tool_calls")] and client_view(out).calls[0]["name"] == "bash"
    assert [(c.kind, c.before, c.after) for c in stage.changes] == [("finish_repeated", trailing, None)]
    assert stage.outcome == "repaired" and "finish_repeated" in stage.defects


@pytest.mark.parametrize("seed", SEEDS)
def test_the_first_finish_is_the_one_the_repair_made(seed: int) -> None:
    """`stop` with a call is corrected to `tool_calls`; a trailing `stop` after it is dropped."""
    _, out, _ = run([ROLE, *LS, chunk(finish_reason="stop"), chunk(finish_reason="stop")], seed)
    assert finishes(out) == [(0, "tool_calls")]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_repeated_finishes_chunk_keeps_what_else_it_carries(seed: int) -> None:
    _, out, _ = run([ROLE, *LS, chunk(finish_reason="tool_calls"), chunk(finish_reason="stop", usage=USAGE)], seed)
    assert finishes(out) == [(0, "tool_calls")]
    assert [c["usage"] for c in client_view(out).chunks if c.get("usage")] == [USAGE]


@pytest.mark.parametrize("seed", SEEDS)
def test_each_choice_keeps_its_own_first_finish(seed: int) -> None:
    stream = [
        chunk({"role": "assistant", "content": ""}, index=0),
        chunk({"role": "assistant", "content": ""}, index=1),
        *LS,
        chunk({"content": "No tool needed."}, index=1),
        chunk(finish_reason="tool_calls", index=0),
        chunk(finish_reason="stop", index=1),
        chunk(finish_reason="stop", index=0),
    ]
    _, out, _ = run(stream, seed)
    assert finishes(out) == [(0, "tool_calls"), (1, "stop")]


ONE_FINISH = {
    "a call": [ROLE, *LS, chunk(finish_reason="tool_calls"), chunk(usage=USAGE, created=1)],
    "text": [ROLE, chunk({"content": "Hi."}), chunk(finish_reason="stop")],
    "two choices": [
        chunk({"role": "assistant", "content": ""}, index=1),
        chunk({"content": "Hi."}, index=1),
        *LS,
        chunk(finish_reason="tool_calls"),
        chunk(finish_reason="stop", index=1),
    ],
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("stream", ONE_FINISH.values(), ids=ONE_FINISH.keys())
def test_one_finish_per_choice_passes_byte_for_byte(stream: list[dict[str, Any]], seed: int) -> None:
    data, out, stage = run(stream, seed)
    assert out == data and stage.outcome == "untouched" and stage.changes == []


@pytest.mark.parametrize("seed", SEEDS)
def test_calls_after_a_text_finish_end_with_their_own(seed: int) -> None:
    """The later finish is the one that keeps the calls: it goes out."""
    stream = [ROLE, chunk({"content": "Let me look."}), chunk(finish_reason="stop"), *LS]
    _, out, _ = run([*stream, chunk(finish_reason="tool_calls")], seed)
    assert finishes(out) == [(0, "stop"), (0, "tool_calls")] and client_view(out).calls


def test_without_tools_nothing_is_looked_at() -> None:
    """A request that offered no tools has no call to lose: its stream passes as it came."""
    data = sse([ROLE, chunk({"content": "Hi."}), chunk(finish_reason="stop"), chunk(finish_reason="stop")])
    assert run_stage(ChatToolCallRepair(None), [data]) == data


def test_messages_keeps_tool_use_on_a_trailing_message_delta() -> None:
    """The same defect on Messages: every `message_delta` after a tool_use block went out says `tool_use`
    (what the stage did before issue 31; held here so it stays so)."""
    from tapfix.proxy.toolcalls import MessagesToolCallRepair

    block = {"type": "tool_use", "id": "toolu_a", "name": "bash", "input": {}}
    json_delta = {"type": "input_json_delta", "partial_json": '{"command": "ls"}'}
    events = [
        named_event({"type": "content_block_start", "index": 0, "content_block": block}),
        named_event({"type": "content_block_delta", "index": 0, "delta": json_delta}),
        named_event({"type": "content_block_stop", "index": 0}),
        named_event({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}}),
        named_event({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}}),
    ]
    stage = MessagesToolCallRepair([{"name": "bash", "input_schema": TOOLS[0]["function"]["parameters"]}])
    out = b"".join(e for raw in events for e in stage.feed(raw))
    stops = [e["delta"]["stop_reason"] for e in sse_json(out) if e["type"] == "message_delta"]
    assert stops == ["tool_use", "tool_use"]
