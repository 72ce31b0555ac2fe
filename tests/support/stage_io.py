"""Drive the Chat Completions tool-call stage over pieces of a stream, and read its output the way a
strict client would. (The streams themselves are built with tests/support/builders.py.)"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.sse import SSESplitter, event_data
from tapfix.proxy.toolcalls import MessagesToolCallRepair, ResponsesToolCallRepair
from tapfix.proxy.toolcalls.accumulate import assemble_tool_calls
from tapfix.proxy.toolcalls.chat_stage import ChatToolCallRepair

# A write call every surface's repair tests stream: its schema, its arguments, and those arguments in fragments.
WRITE_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "force": {"type": "boolean"}},
    "required": ["path", "content"],
}
WRITE_ARGS = {"path": "hello.txt", "content": "hi there"}
WRITE_FRAGMENTS = ['{"path": ', '"hello.txt", ', '"content": "hi', ' there"}']


ToolCallStage = ChatToolCallRepair | MessagesToolCallRepair | ResponsesToolCallRepair


def run_stage(
    stage: ChatToolCallRepair | MessagesToolCallRepair | ResponsesToolCallRepair, pieces: list[bytes]
) -> bytes:
    """A tool-call stage (any surface's) fed the events of `pieces` as they complete, then flushed."""
    splitter = SSESplitter()
    out: list[bytes] = []
    for piece in pieces:
        for event in splitter.feed(piece):
            out += stage.feed(event)
    for event in splitter.flush():
        out += stage.feed(event)
    out += stage.flush()
    for item in out:
        assert isinstance(item, bytes) and item, "stages return whole non-empty events"
    return b"".join(out)


def assert_passes_untouched(run: Any, data: bytes, cuts: list[int] | None = None, crlf: bool = False) -> None:
    """A valid stream (with CRLF line ends if `crlf`), split at `cuts`, comes out of `run(data, cuts)` (a
    surface's stage driven by run_stage) byte for byte, and the stage says it left it untouched."""
    if crlf:
        data = data.replace(b"\n", b"\r\n")
    out, stage = run(data, cuts)
    assert out == data and stage.outcome == "untouched"


@dataclass
class ClientView:
    chunks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    comments: list[bytes] = field(default_factory=list)
    done: int = 0
    after_done: int = 0

    @property
    def calls(self) -> list[dict[str, Any]]:
        return assemble_tool_calls(self.chunks)

    @property
    def content(self) -> str:
        return "".join(
            (ch.get("delta") or {}).get("content") or "" for c in self.chunks for ch in c.get("choices") or []
        )

    @property
    def finish_reasons(self) -> list[str]:
        return [ch["finish_reason"] for c in self.chunks for ch in c.get("choices") or [] if ch.get("finish_reason")]


def client_view(data: bytes) -> ClientView:
    view = ClientView()
    splitter = SSESplitter()
    for event in splitter.feed(data) + splitter.flush():
        payload = event_data(event)
        if payload is None:
            view.comments.append(event)
            continue
        if view.done:
            view.after_done += 1
        if payload.strip() == b"[DONE]":
            view.done += 1
            continue
        obj = json.loads(payload)
        if "error" in obj and "choices" not in obj:
            view.errors.append(obj["error"])
        else:
            view.chunks.append(obj)
    return view


def judged_view(stage: Any, policy: str, out: bytes) -> ClientView | None:
    """What a client reads from a stage that met a mutated stream, or None where there is nothing to judge:
    the passthrough policy, a stream the stage left untouched, or output a mutation made unreadable (an event
    it broke went through untouched, as any other opaque event)."""
    if policy == "passthrough" or stage.outcome == "untouched":
        return None
    try:
        return client_view(out)
    except ValueError:
        return None
