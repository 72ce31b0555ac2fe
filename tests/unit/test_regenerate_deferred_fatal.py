"""Issue 19: the Chat Completions tool-call stage can keep an unrecoverable message's error event back
(`defer_fatal`), so the relay's splice may ask the upstream again before the client sees a failure."""

from __future__ import annotations

from tapfix.proxy.toolcalls.chat_stage import ChatToolCallRepair

from tests.support.builders import chat_chunk, sse, tool, tool_call_chunk
from tests.support.stage_io import client_view, run_stage

TOOLS = [tool("read", {"path": {"type": "string"}}, ["path"])]
BROKEN = sse(
    [
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Reading."}),
        tool_call_chunk(0, "c1", "read", '{"pa'),
        chat_chunk({}, "tool_calls"),
    ]
)


def test_deferred_fatal_keeps_the_error_event_and_done_back() -> None:
    stage = ChatToolCallRepair(TOOLS, capture_id="cap-d")
    stage.defer_fatal = True
    view = client_view(run_stage(stage, [BROKEN]))
    assert stage.outcome == "unrecoverable"
    assert view.errors == [] and view.done == 0 and view.calls == []
    assert view.content == "Reading."
    held = client_view(b"".join(stage.deferred))
    assert held.errors and held.errors[0]["tapfix"]["reason"] == "tool_call_unrecoverable" and held.done == 1


def test_without_defer_fatal_the_error_goes_out_as_today() -> None:
    stage = ChatToolCallRepair(TOOLS, capture_id="cap-d")
    view = client_view(run_stage(stage, [BROKEN]))
    assert view.errors and view.done == 1 and stage.deferred == []
