"""The repeated bytes of a chat stream's events: what lets the writer fold most events without parsing them.

An engine serializes every content delta (and every fragment of a tool call's arguments) as the same bytes
around one JSON string: id, model, index, nulls, and the text. Once one event of a stream shows those bytes
(its `Shape`), an event that is `prefix + S + suffix`, `S` one JSON string, is that event with `S` in the
text's place: JSON reads the same tokens around any string put there, so it folds as the text alone. A
probe (the shape's bytes around another string, parsed) shows the text's string is the value the event's
object holds (not a duplicate key's that a later one overrides) and that nothing else depends on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

CONTENT = b'"delta":{"content":'
ARGUMENTS = b'"function":{"arguments":'
_PROBE = "\x00probe"


@dataclass(frozen=True, slots=True)
class Shape:
    prefix: bytes
    suffix: bytes
    call: dict[str, Any] | None  # the tool-call delta whose `function.arguments` is the text; None: content

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
    choice, delta = found
    call: dict[str, Any] | None = None
    text, marker = delta.get("content"), CONTENT
    if text is None:
        calls = delta.get("tool_calls")
        if calls.__class__ is not list or len(calls) != 1 or calls[0].__class__ is not dict:
            return None
        call, marker = calls[0], ARGUMENTS
        function = call.get("function")
        text = function.get("arguments") if function.__class__ is dict else None
    if text.__class__ is not str:
        return None
    start = data.find(marker) + len(marker)
    token = orjson.dumps(text)
    if start < len(marker) or data[start : start + len(token)] != token:
        return None
    shape = Shape(data[:start], data[start + len(token) :], call)
    swapped: Callable[[str], dict[str, Any]] = (
        (lambda s: {"content": s}) if call is None else (lambda s: {"tool_calls": [shape.call_with(s)]})
    )
    try:
        probe = orjson.loads(shape.prefix + orjson.dumps(_PROBE) + shape.suffix)
    except orjson.JSONDecodeError:
        return None
    return shape if probe == {**obj, "choices": [{**choice, "delta": swapped(_PROBE)}]} else None
