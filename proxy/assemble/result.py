"""The one message shape every surface's response is folded into (what the store and the browser read)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass
class Assembled:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # llama.cpp's `timings` (a body's, a stream's last): `cache_n` in it
    error: Any = None
    events: int = 0
    malformed_events: int = 0
    first_token_chunk: int | None = None  # index of the input chunk that completed the first token event
    done: bool = False
    index: int = 0  # the chat `choices[i].index` this message is
    # Every choice, this one first, when the answer has more than one (`n > 1`); empty otherwise.
    choices: list[Assembled] = field(default_factory=list, repr=False, compare=False)
    flags: set[str] = field(default_factory=set)  # this choice's own flags (`response_flags` fills them)
    # Text arrives in thousands of small deltas: collect pieces and join once (`+=` on an attribute
    # copies the whole string every time, which made a 1 MB answer cost seconds of writer CPU).
    _parts: dict[str, list[str]] = field(default_factory=dict, repr=False, compare=False)

    def append(self, key: str, text: str) -> None:
        parts = self._parts.get(key)
        if parts is None:
            self._parts[key] = [text]
        else:
            parts.append(text)

    def pieces(self, key: str) -> list[str]:
        """The pieces `append` collects for `key`, to append to directly (the chat fold's loop)."""
        return self._parts.setdefault(key, [])

    def join_parts(self) -> Assembled:
        for key, parts in self._parts.items():
            setattr(self, key, getattr(self, key) + "".join(parts))
        self._parts.clear()
        return self

    def event_object(self, data: bytes) -> dict[str, Any] | None:
        """An event's JSON object; None, counted as malformed, when its data isn't one."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            self.malformed_events += 1
            return None
        return obj

    def as_dict(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": self.tool_calls,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "error": self.error,
            "done": self.done,
        }


def engine_error(error: Any) -> dict[str, Any] | None:
    """The error object an engine sent (`{"error": {...}}` in a body or an event), as it sent it.

    Kept whole (llama-server adds `n_prompt_tokens`, `n_ctx`); only a Responses event's
    `sequence_number` (framing, not error) is dropped. A bare string becomes `{"message": ...}`."""
    if error is None or error is False or error == "":
        return None
    if isinstance(error, dict):
        return {k: v for k, v in error.items() if k != "sequence_number"} or None
    return {"message": error if isinstance(error, str) else str(error)}
