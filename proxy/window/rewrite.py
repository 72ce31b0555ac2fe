"""An engine's overflow error rewritten into the surface's standard one: a whole error body, or an error event
inside a 200 stream (SGLang, TabbyAPI and older llama.cpp send it there once the stream has started).

The engine's bytes stay in the capture as the upstream's answer; the rewrite is a `window` change whose
`before` is the engine's error object and `after` the one the client got.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.errors import LocalAnswer, context_overflow, context_overflow_event
from tapfix.proxy.sse import event_data
from tapfix.proxy.surfaces import Surface, api_surface
from tapfix.proxy.window.overflow import EngineOverflow, error_object, recognise

FLAG = "context_overflow"


def _reason(found: EngineOverflow) -> str:
    return f"{found.engine}'s overflow error, in the surface's standard shape agents compact on"


def rewrite_body(
    surface: Surface | None, body: bytes, window: int | None, prompt_tokens: int | None
) -> tuple[LocalAnswer, Change] | None:
    """The standard 400 for an engine's overflow error body (None: another error). The numbers are the
    engine's where its text has them, else what tapfix knows (the window, its own count by the engine)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    found = recognise(obj)
    if found is None:
        return None
    answer = context_overflow(surface, found.prompt_tokens or prompt_tokens, found.window or window)
    return answer, Change("window", "rewrite", "$.error", error_object(obj), answer.error, _reason(found))


@dataclass
class OverflowEvents:
    """Stream stage: the event that carries an engine's overflow error becomes the surface's own overflow
    event; every other event passes as the same bytes object (one substring check)."""

    surface: Surface | None
    window: int | None = None
    prompt_tokens: int | None = None
    changes: list[Change] = field(default_factory=list)
    seq: int = 0

    def feed(self, event: bytes) -> list[bytes]:
        if event.find(b"rror") < 0:  # "error", "Error", "exceed_context_size_error"; find: `in` costs 3x on bytes
            if api_surface(self.surface).numbered:
                self.seq += 1
            return [event]
        data = event_data(event)
        obj: Any = None
        if data:
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                obj = None
        found = recognise(obj)
        if found is None:
            return [event]
        newline = b"\r\n" if b"\r\n" in event else b"\n"
        prompt, window = found.prompt_tokens or self.prompt_tokens, found.window or self.window
        replaced = context_overflow_event(self.surface, prompt, window, newline, self.seq)
        after = context_overflow(self.surface, prompt, window).error
        self.changes.append(Change("window", "rewrite", "$.error", error_object(obj), after, _reason(found)))
        return [replaced]

    def flush(self) -> list[bytes]:
        return []
