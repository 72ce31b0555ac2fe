"""Anthropic Messages (`/v1/messages`): `messages` of typed content blocks beside `system`, named events,
and Anthropic's own error shape, typed by Anthropic's words (`invalid_request_error`,
`authentication_error`, `not_found_error`, `api_error`, `overloaded_error`), since the anthropic SDK and
Claude Code read only that shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tapfix.proxy.sse import named_event
from tapfix.proxy.surfaces.base import ApiSurface

# Anthropic's error type for a status (its API's own table); any other 4xx is invalid_request_error,
# any other 5xx api_error. The anthropic SDK picks its exception by status, Claude Code shows the type.
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    407: "authentication_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    return _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


@dataclass(frozen=True, slots=True)
class _Messages(ApiSurface):
    def error_object(
        self, status: int, message: str, kind: str, code: str | None = None, param: str | None = None
    ) -> dict[str, Any]:
        """Anthropic's type for the status in place of OpenAI's `type`, `code` and `param`."""
        return {"type": anthropic_type(status), "message": message}

    def error_body(self, error: dict[str, Any]) -> dict[str, Any]:
        return {"type": "error", "error": error}

    def error_shaped(self, obj: dict[str, Any]) -> bool:
        return obj.get("type") == "error"

    def overflow_message(self, prompt_tokens: int | None, window: int | None) -> str:
        if prompt_tokens is not None and window is not None:
            return f"prompt is too long: {prompt_tokens} tokens > {window} maximum"
        if window is not None:
            return f"prompt is too long: the prompt exceeds the {window} tokens maximum"
        return "prompt is too long"

    def overflow_events(self, error: dict[str, Any], newline: bytes = b"\n", seq: int = 0) -> bytes:
        return named_event("error", self.error_body(error), newline)

    def reset_events(self, message: str, tapfix: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        error: dict[str, Any] = {"type": "api_error", "message": message}
        return named_event("error", self.error_body(error)), error


MESSAGES = _Messages(
    name="messages",
    path="messages",
    conversation="messages",
    instructions="system",
    typed_content=True,
    max_tokens_fields=("max_tokens",),
    sampling_params=frozenset({"temperature", "top_p", "top_k", "max_tokens"}),
    sampling_defaults=False,
    framing="events",
    item_field="content_block",
    index_field="index",
    answer_field="content",
    operation="chat",
    provider="anthropic",
)
