"""The repeated bytes of a chat stream's events: what lets the writer fold most events without parsing them.

An engine serializes every content delta (and every fragment of a tool call's arguments) as the same bytes
around one JSON string: id, model, index, nulls, and the text. Once one event of a stream shows those bytes
(its `Shape`: the event's `sse_envelope.Envelope` around the text, proved by probe parses), an event that is
`prefix + S + suffix`, `S` one JSON string, is that event with `S` in the text's place: it folds as the
text alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tapfix.proxy.sse_envelope import Envelope
from tapfix.proxy.sse_envelope import learn as learn_envelope

CONTENT = b'"delta":{"content":'  # `chat.py` tries to learn a shape only from an event holding one of these
ARGUMENTS = b'"function":{"arguments":'
_CONTENT = ("choices", 0, "delta", "content")
_ARGUMENTS = ("choices", 0, "delta", "tool_calls", 0, "function", "arguments")


@dataclass(frozen=True, slots=True)
class Shape:
    """An event's envelope around its text, and what the text is. The fold's loop (`chat.py`) reads a later
    event's text as `Envelope.string` does, inlined over the stream's few shapes: it runs for every event."""

    envelope: Envelope
    call: dict[str, Any] | None  # the tool-call delta whose `function.arguments` is the text; None: content

    @property
    def prefix(self) -> bytes:
        """The bytes before the text's JSON string (`Envelope.string` reads the string from here on)."""
        return self.envelope.head[:-1]

    @property
    def suffix(self) -> bytes:
        """The bytes after the text's JSON string."""
        return self.envelope.tail[1:]

    def call_with(self, arguments: str) -> dict[str, Any]:
        """The tool-call delta of an event of this shape whose text is `arguments`."""
        assert self.call is not None
        return {**self.call, "function": {**self.call["function"], "arguments": arguments}}


def single_delta(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(choice, delta) of an event that is choice 0's delta of one key and nothing else (no usage, error,
    timings, finish reason, legacy text): what the chat fold folds without its general walk."""
    choices = obj.get("choices")
    if (
        choices.__class__ is list
        and len(choices) == 1
        and not obj.get("usage")
        and "error" not in obj
        and obj.get("timings").__class__ is not dict
    ):
        choice = choices[0]
        if (
            choice.__class__ is dict
            and not choice.get("finish_reason")
            and not choice.get("index")
            and "text" not in choice
        ):
            delta = choice.get("delta")
            if delta.__class__ is dict and len(delta) == 1:
                return choice, delta
    return None


def learn(data: bytes, obj: dict[str, Any]) -> Shape | None:
    """The shape of event `data` (parsed: `obj`) when it is a content delta or a tool call's arguments
    fragment alone; None otherwise."""
    found = single_delta(obj)
    if found is None:
        return None
    delta = found[1]
    if "content" in delta:
        envelope = learn_envelope(data, obj, _CONTENT)
        return Shape(envelope, None) if envelope is not None else None
    calls = delta.get("tool_calls")
    if calls.__class__ is not list or len(calls) != 1 or calls[0].__class__ is not dict:
        return None
    envelope = learn_envelope(data, obj, _ARGUMENTS)
    return Shape(envelope, calls[0]) if envelope is not None else None
