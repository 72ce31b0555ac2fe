"""OpenAI Responses (`/v1/responses`): `input` items beside `instructions`, numbered named events, and
answers whose ids the next request names (`previous_response_id`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tapfix.proxy.sse import named_event
from tapfix.proxy.surfaces.base import ApiSurface


@dataclass(frozen=True, slots=True)
class _Responses(ApiSurface):
    @property
    def overflow_param(self) -> str:
        return "input"

    def overflow_events(self, error: dict[str, Any], newline: bytes = b"\n", seq: int = 0) -> bytes:
        """`error` then `response.failed`; `error` first: the openai SDK raises on an event whose data has an
        `error`."""
        code, message = error["code"], error["message"]
        failed = {"object": "response", "status": "failed", "output": [], "error": {"code": code, "message": message}}
        head = {"type": "error", "code": code, "message": message, "param": "input", "error": error}
        return named_event("error", {**head, "sequence_number": seq}, newline) + named_event(
            "response.failed", {"type": "response.failed", "sequence_number": seq + 1, "response": failed}, newline
        )

    def reset_events(self, message: str, tapfix: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        error = {"message": message, "type": "server_error", "code": 502, "tapfix": tapfix}
        data = {"type": "error", "code": "server_error", "message": message, "error": error, "sequence_number": 0}
        return named_event("error", data), error


RESPONSES = _Responses(
    name="responses",
    path="responses",
    conversation="input",  # a list of items, or one string: the user's message
    item_turns=True,
    instructions="instructions",
    max_tokens_fields=("max_output_tokens",),
    sampling_params=frozenset({"temperature", "top_p", "max_tokens"}),
    reasoning_effort=("reasoning", "effort"),
    openai_levels_only=True,
    framing="events",
    numbered=True,
    item_field="item",
    index_field="output_index",
    answer_field="output",
    chains_ids=True,
    operation="chat",
    provider="openai",
)
