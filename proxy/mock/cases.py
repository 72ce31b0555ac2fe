"""Corpus cases (DESIGN.md "Corpus case format") served as real SSE streams.

A case's `stream` holds the objects that followed `data: ` on the wire. They are sent as compact JSON
in the case's own key order, UTF-8 unescaped (what pydantic and llama-server emit), then `data: [DONE]`.
A stream whose last object is `{"error": …}` came from llama-server, which sends that event and closes
the stream without `[DONE]` (tools/server: "error received during streaming, terminating stream"); the
mock does the same. A non-streamed request gets the stream assembled into the one `chat.completion`
the server would have returned, or, for an error case, the error body with its HTTP status.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapfix.proxy.mock.chat import DONE, chat_completion, dumps, reply_message
from tapfix.proxy.mock.jsonish import arr, obj


def event_bytes(item: Any) -> bytes:
    return b"data: " + json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Case:
    name: str
    data: dict[str, Any]
    events: list[bytes]  # the SSE events, `[DONE]` included unless the stream ends in an error
    error: dict[str, Any] | None  # the trailing error object, if any

    def non_stream(self) -> tuple[int, bytes]:
        """(status, body) of the same answer, not streamed."""
        if self.error is not None:
            code = self.error.get("code")
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            return status, dumps({"error": self.error})
        return 200, dumps(assemble(self.data.get("stream", [])))


def load_case(source: Path | dict[str, Any], name: str | None = None) -> Case:
    """A case from a file or an inline object (scenario files may embed one)."""
    if isinstance(source, dict):
        data = source
        name = name or str(data.get("name") or "inline-case")
    else:
        data = json.loads(Path(source).read_text(encoding="utf-8"))
        name = name or Path(source).stem
    stream = data.get("stream")
    if not isinstance(stream, list) or not stream:
        raise ValueError(f"case {name}: `stream` must be a non-empty list")
    events = [event_bytes(item) for item in stream]
    last = stream[-1]
    error = last["error"] if isinstance(last, dict) and "error" in last and "choices" not in last else None
    if error is None:
        events.append(DONE)
    elif not isinstance(error, dict):
        error = {"message": str(error), "type": "server_error", "code": 500}
    return Case(name=name, data=data, events=events, error=error)


def assemble(stream: list[Any]) -> dict[str, Any]:
    """Fold chunk deltas into one message, as the server's non-streaming path would have built it.

    Argument fragments are concatenated as strings; an object-valued fragment (some servers send
    `arguments` as an object) is kept as the object when it is the only one, else serialized.
    """
    first = next((o for o in stream if isinstance(o, dict) and "choices" in o), {})
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    finish: str | None = None
    usage: Any = None
    for item in stream:
        chunk = obj(item)
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in map(obj, arr(chunk.get("choices"))):
            delta = obj(choice.get("delta"))
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for key in ("reasoning", "reasoning_content"):
                if isinstance(delta.get(key), str):
                    reasoning.append(delta[key])
            for tc in map(obj, arr(delta.get("tool_calls"))):
                raw_index = tc.get("index")
                index = raw_index if isinstance(raw_index, int) else 0
                if index not in calls:
                    calls[index] = {"id": None, "name": None, "args": []}
                    order.append(index)
                call = calls[index]
                call["id"] = call["id"] or tc.get("id")
                fn = obj(tc.get("function"))
                call["name"] = call["name"] or fn.get("name")
                if fn.get("arguments") is not None:
                    call["args"].append(fn["arguments"])
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    tool_calls = []
    for index in order:
        call = calls[index]
        args: Any = call["args"]
        if len(args) == 1 and not isinstance(args[0], str):
            arguments: Any = args[0]
        else:
            arguments = "".join(a if isinstance(a, str) else json.dumps(a, ensure_ascii=False) for a in args)
        tool_calls.append(
            {
                "id": call["id"] or f"call-{index}",
                "type": "function",
                "function": {"name": call["name"] or "", "arguments": arguments},
            }
        )
    text = "".join(content)
    message = reply_message(text if (text or not tool_calls) else None, "".join(reasoning) or None, tool_calls)
    return chat_completion(
        str(first.get("id") or "chatcmpl-case"),
        int(first.get("created") or 0),
        str(first.get("model") or "case"),
        message,
        finish,
        usage,
    )
