"""Usage always: a streamed chat completion carries token counts only when the client set
`stream_options.include_usage`; without them the client estimates low and never compacts, and the capture,
metrics and traces have no counts either. tapfix asks the engine for them anyway and gives the client the
stream it asked for: the usage-only chunk (`choices: []`) removed, and what the engine moved onto it put back
on the chunk before (vLLM moves `system_fingerprint` there, llama.cpp its `timings`: a real vLLM sample,
`../shared/vllm-samples/hermes/01_stream_chat_free.body` against `02_stream_chat_free_usage.body`; llama.cpp
`tools/server/server-task.cpp`, `to_json_oaicompat_chat_stream`), and any `"usage": null` the option added to
the other chunks (OpenAI's way) removed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.jsonsplice import Delete, Set, SpliceError, splice, top_level_spans
from tapfix.proxy.sse import event_data

# The engines whose chat API takes `stream_options.include_usage` (vLLM: the real sample above; SGLang:
# `python/sglang/srt/entrypoints/openai/protocol.py` StreamOptions; llama.cpp: `server-schema.cpp`; Ollama:
# `openai/openai.go` StreamOptions; TabbyAPI: `endpoints/OAI/types/common.py` ChatCompletionStreamOptions).
# An unknown upstream (quick mode without --engine) is not sent a field it may refuse.
ENGINES = ("vllm", "sglang", "llamacpp", "ollama", "tabbyapi")
PATH = "$.stream_options.include_usage"
ADDED = "usage_added"  # ex.extra: tapfix asked for usage the client didn't
# The members every chunk has; any other member of the usage chunk came off the chunk before it.
_CHUNK_MEMBERS = frozenset(("id", "object", "created", "model", "choices", "usage"))


def ask_for_usage(body: bytes, parsed: dict[str, Any] | None = None) -> tuple[bytes, Any] | None:
    """The streamed chat request with `stream_options.include_usage` set, and what it was before; None: not
    a stream, the client asked already, or its `stream_options` is not an object (the engine's own error
    answers that). `parsed`: the body's parse, when the caller has it (else it is parsed here); the option
    is spliced in from the end of the body, the messages not scanned (`jsonsplice.splice`)."""
    if parsed is None:
        parsed = json_object(body)
        if parsed is None:
            return None
    if parsed.get("stream") is not True:
        return None
    options = parsed.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return None
    before = options.get("include_usage") if isinstance(options, dict) else None
    if before is True:
        return None
    try:
        return splice(body, [Set(("stream_options", "include_usage"), True)], parsed), before
    except SpliceError:
        return None


def with_usage(parsed: Mapping[str, Any]) -> dict[str, Any]:
    """The parse of what `ask_for_usage` returns, from the parse of what it was given (members in the same order)."""
    options = parsed.get("stream_options")
    return {**parsed, "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}


def request_change(before: Any) -> Change:
    return Change(
        "window",
        "set",
        PATH,
        before,
        True,
        "usage for the capture, metrics and traces; the client's stream gets no usage chunk (it didn't ask)",
    )


@dataclass
class UsageChunkStrip:
    """Stream stage: the usage-only chunk out, its extra members back on the chunk before it. A chunk that
    ends a choice (a `finish_reason`) is held until the next event, the usage chunk that follows at once."""

    held: list[bytes] = field(default_factory=list)
    usage: Any = None
    removed: int = 0

    def feed(self, event: bytes) -> list[bytes]:
        if b'"usage"' in event:
            obj = _data(event)
            if isinstance(obj, dict) and obj.get("choices") == [] and "usage" in obj:
                self.usage, self.removed = obj.get("usage"), self.removed + 1
                self._move_extras(event, obj)
                return self._release()
            if isinstance(obj, dict) and "usage" in obj and obj["usage"] is None:
                event = _without_null_usage(event)
        if b'"finish_reason":"' in event or b'"finish_reason": "' in event:
            self.held.append(event)
            return []
        return [*self._release(), event]

    def flush(self) -> list[bytes]:
        return self._release()

    def change(self) -> Change | None:
        if not self.removed:
            return None
        return Change("window", "strip", "usage chunk", self.usage, None, "the client didn't ask for usage")

    def _release(self) -> list[bytes]:
        out, self.held = self.held, []
        return out

    def _move_extras(self, event: bytes, obj: dict[str, Any]) -> None:
        extras = [k for k in obj if k not in _CHUNK_MEMBERS]
        if not extras or not self.held:
            return
        data = event_data(event) or b""
        spans = top_level_spans(data)
        last = self.held[-1]
        last_obj = _data(last)
        members = b"".join(
            b"," + orjson.dumps(k) + b":" + data[spans[k][0] : spans[k][1]]
            for k in extras
            if k in spans and not (isinstance(last_obj, dict) and k in last_obj)
        )
        close = last.rfind(b"}")
        if members and close >= 0:
            self.held[-1] = last[:close] + members + last[close:]


def _data(event: bytes) -> Any:
    data = event_data(event)
    if not data:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _without_null_usage(event: bytes) -> bytes:
    data = event_data(event) or b""
    start = event.find(data)
    try:
        return event[:start] + splice(data, [Delete(("usage",))]) + event[start + len(data) :]
    except SpliceError:
        return event
