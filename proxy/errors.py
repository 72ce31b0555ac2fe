"""Every error tapfix itself emits, in the shape each client reads: one place to keep them agreeing.

Each error is in the request's surface's own shape (DESIGN.md), which the surface object holds
(`tapfix.proxy.surfaces`): on chat, completions and Responses (and any other path) OpenAI's
`{"error": {"message", "type", "param", "code"}}`; on Messages Anthropic's `{"type": "error", "error":
{"type", "message"}}`, typed by Anthropic's own words. This module words them.

Two families:

- **Answers instead of forwarding** (`request_error`, `internal_error`, `unauthorized`,
  `upstream_unreachable`, `shutting_down`), one function per error, each taking the surface (the
  addons answer through `addons/runner/http.answer_locally`): a `LocalAnswer`, the status, the body
  and the error object in it (what the capture's `error` column holds: the exchange is tapfix's,
  never the upstream's). A 4xx is `invalid_request_error`, so agents stop instead of retrying.
- **Errors inside a response** (a tool call tapfix can't recover, an upstream reset mid-stream): in
  the stream's own framing per surface (`reset_event` takes the surface; the tool-call error has a
  function per surface, called by that surface's stage), worded so agents retry or stop as the policy wants. Agents
  decide from the words alone (clients.md §8): policy "error" carries all three retry signals
  (server-error words, a numeric 5xx code, "server error" in the message) so opencode, omp and pi
  regenerate the turn; "fail_fast" carries none of them, in any field, so every agent stops.

The mock's engine-style errors live in `tapfix.proxy.mock`, never here: the mock plays engines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from tapfix.proxy.sse import format_event, named_event
from tapfix.proxy.surfaces import Surface, api_surface
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy

TOOL_CALL_UNRECOVERABLE = "tool_call_unrecoverable"
SHUTDOWN_REASON = "proxy_shutdown"
SHUTDOWN_MESSAGE = "tapfix server error: the proxy is shutting down (server unavailable); retry the request"
# What opencode, omp and pi read as "transient, retry": kept out of every fail_fast field.
_TRANSIENT = re.compile(
    r"server[ _]error|unavailable|timeout|timed out|internal|overloaded|exhausted|terminated|try again|"
    r"connection|network|fetch failed|upstream connect|rate limit|429|5\d\d",
    re.I,
)


# -- answers instead of forwarding --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LocalAnswer:
    """What tapfix answers itself: `status`, `body` (JSON in the surface's shape) and `error`, the error
    object inside the body as the client reads it."""

    status: int
    body: bytes
    error: dict[str, Any]

    def error_text(self) -> str:
        """The error object as JSON text, as the capture's `error` column holds it."""
        try:
            return orjson.dumps(self.error).decode()
        except TypeError:  # a lone surrogate (a model name): ASCII escapes carry it
            return json.dumps(self.error)


def _answer(
    surface: Surface | None, status: int, message: str, kind: str, code: str | None = None, param: str | None = None
) -> LocalAnswer:
    """The body in the surface's shape. `kind`, `code` and `param` are OpenAI's fields; Messages gets
    Anthropic's type for the status instead."""
    shape = api_surface(surface)
    error = shape.error_object(status, message, kind, code, param)
    return LocalAnswer(status, shape.error_json(error), error)


def request_error(
    surface: Surface | None, status: int, message: str, code: str, param: str | None = None
) -> LocalAnswer:
    """A 4xx: the request can't be served as sent (OpenAI `invalid_request_error`, with `code`;
    Anthropic's type for the status: `not_found_error` for an unknown model, else mostly
    `invalid_request_error`). Agents stop on it."""
    return _answer(surface, status, message, "invalid_request_error", code, param)


def internal_error(surface: Surface | None, message: str) -> LocalAnswer:
    """A 500: tapfix itself failed on this request and can't tell where to forward it."""
    return _answer(surface, 500, message, "tapfix_error", "internal")


def unauthorized(surface: Surface | None, message: str, status: int = 401) -> LocalAnswer:
    """The 401 (407 for a proxy CONNECT) clients recognise as a bad key (OpenAI `invalid_api_key`,
    Anthropic `authentication_error`): they stop."""
    return _answer(surface, status, message, "invalid_request_error", "invalid_api_key")


def upstream_unreachable(surface: Surface | None, message: str) -> LocalAnswer:
    """The 502 when the upstream refuses connections (never mitmproxy's HTML page): agents retry it."""
    return _answer(surface, 502, message, "upstream_unreachable")


def no_response_head(surface: Surface | None, message: str) -> LocalAnswer:
    """The 504 when a routed request's upstream sent no response head in time and no other route could take
    it (issue 38, addons/route_fallback.py): agents retry it."""
    return _answer(surface, 504, message, "server_error", "upstream_head_timeout")


def no_eligible_route(surface: Surface | None, message: str) -> LocalAnswer:
    """The 503 when no route of a model can take the request (issue 38, request/routes.py): agents retry it."""
    return _answer(surface, 503, message, "server_error", "no_eligible_route")


def shutting_down(surface: Surface | None) -> LocalAnswer:
    """The 503 a request gets while tapfix drains for shutdown (Anthropic `overloaded_error`): agents
    retry it, on another connection."""
    return _answer(surface, 503, SHUTDOWN_MESSAGE, "server_error", SHUTDOWN_REASON)


# -- a prompt that does not fit the context window -----------------------------------------------
CONTEXT_OVERFLOW = "context_length_exceeded"


def overflow_message(surface: Surface | None, prompt_tokens: int | None, window: int | None) -> str:
    """The overflow text the agents' pattern lists recognise (opencode's `provider/error.ts`, pi's
    `utils/overflow.ts`): OpenAI's on chat and Responses, Anthropic's on Messages; the real numbers where
    they are known, never made up."""
    return api_surface(surface).overflow_message(prompt_tokens, window)


def context_overflow(surface: Surface | None, prompt_tokens: int | None, window: int | None) -> LocalAnswer:
    """The 400 each surface's clients read as "compact the conversation": `invalid_request_error`, code
    `context_length_exceeded`, param `messages` (chat) or `input` (Responses); Anthropic's
    `invalid_request_error` with "prompt is too long" on Messages."""
    param = api_surface(surface).overflow_param
    return _answer(
        surface, 400, overflow_message(surface, prompt_tokens, window), "invalid_request_error", CONTEXT_OVERFLOW, param
    )


PROMPT_NEVER_FITS = "prompt_exceeds_window"


def prompt_never_fits(surface: Surface | None, prompt_tokens: int, window: int) -> LocalAnswer:
    """A 400 for a request whose overflow tapfix answered before, sent again as it was: the agent compacted
    and its prompt didn't get shorter (its own system prompt and tools are larger than the window), so one
    more "compact" answer would only start the cycle again (opencode against a real llama-server: the same
    request 70 times in 45 s). Worded so no agent's overflow pattern matches: a plain client error stops it."""
    message = (
        f"This request's prompt needs {prompt_tokens} tokens and the model holds {window}. It was refused before "
        "and came back unchanged: compacting the conversation didn't shorten it, because the agent's fixed "
        "prompt (its system prompt and tools) is larger than the model can take. Give the server a larger "
        "context size or choose a model with a larger window."
    )
    return _answer(surface, 400, message, "invalid_request_error", PROMPT_NEVER_FITS, None)


def context_overflow_event(
    surface: Surface | None, prompt_tokens: int | None, window: int | None, newline: bytes = b"\n", seq: int = 0
) -> bytes:
    """The same error once a stream has started, in the stream's own framing: chat's `data: {"error": ...}`,
    Responses' `response.failed`, Messages' `event: error`."""
    error = context_overflow(surface, prompt_tokens, window).error
    return api_surface(surface).overflow_events(error, newline, seq)


# -- a tool call tapfix can't recover ------------------------------------------------------------
class Unrecoverable(Protocol):
    """What the error needs of a defect (`tapfix.proxy.toolcalls.plan_types.Fatal`)."""

    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def reason(self) -> str: ...


def tool_call_error(fatal: Unrecoverable, policy: ToolRepairPolicy, capture_id: str) -> dict[str, Any]:
    """The chat-shaped error object (`{"error": {...}}`); the other surfaces wrap its words."""
    tapfix: dict[str, Any] = {"reason": TOOL_CALL_UNRECOVERABLE, "capture_id": capture_id, "defect": fatal.kind}
    if policy == "fail_fast":
        name = fatal.name if not _TRANSIENT.search(fatal.name) else "?"
        reason = fatal.reason if not _TRANSIENT.search(fatal.reason) else "arguments could not be recovered"
        if _TRANSIENT.search(capture_id):
            del tapfix["capture_id"]  # an id like "c502" would read as a 502 to opencode
        return {
            "error": {
                "message": f"tapfix could not recover tool call '{name}': {reason}",
                "type": TOOL_CALL_UNRECOVERABLE,
                "code": TOOL_CALL_UNRECOVERABLE,
                "tapfix": tapfix,
            }
        }
    return {
        "error": {
            "message": f"upstream server error: tapfix could not recover tool call '{fatal.name}' ({fatal.reason})",
            "type": "server_error",
            "code": 502,
            "tapfix": tapfix,
        }
    }


def tool_call_error_json(fatal: Unrecoverable, policy: ToolRepairPolicy, capture_id: str) -> bytes:
    """The body that replaces a non-streamed Chat Completions or Responses answer."""
    return json.dumps(tool_call_error(fatal, policy, capture_id), ensure_ascii=False).encode()


def tool_call_error_event(
    fatal: Unrecoverable, policy: ToolRepairPolicy, capture_id: str, newline: bytes = b"\n"
) -> bytes:
    """The Chat Completions `data:` event that ends a stream instead of the held call."""
    return format_event(tool_call_error_json(fatal, policy, capture_id), newline)


def messages_tool_call_error(fatal: Unrecoverable, policy: ToolRepairPolicy, capture_id: str) -> dict[str, Any]:
    """Anthropic's error shape (an `event: error` or a body); the chat error's words inside.

    The anthropic SDK raises `APIStatusError` on any `event: error`; "api_error" and "server error"
    are what clients read as transient, `invalid_request_error` is what stops them."""
    inner = tool_call_error(fatal, policy, capture_id)["error"]
    kind = "api_error" if policy == "error" else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": inner["message"], "tapfix": inner["tapfix"]}}


def responses_tool_call_error_events(
    fatal: Unrecoverable,
    policy: ToolRepairPolicy,
    capture_id: str,
    *,
    seq: int,
    response: dict[str, Any],
    output: list[Any],
    newline: bytes = b"\n",
) -> list[bytes]:
    """`error` then `response.failed`, numbered `seq + 1` and `seq + 2`.

    The `error` event's data also carries an `error` object: that is what makes the openai SDK raise
    `APIError` (it raises on any event whose data has a truthy `error`)."""
    inner = tool_call_error(fatal, policy, capture_id)["error"]
    code = "server_error" if policy == "error" else inner["code"]
    error = {
        "type": "error",
        "code": code,
        "message": inner["message"],
        "param": None,
        "sequence_number": seq + 1,
        "error": inner,
    }
    failed = {**response, "status": "failed", "output": output, "error": {"code": code, "message": inner["message"]}}
    return [
        named_event("error", error, newline),
        named_event(
            "response.failed", {"type": "response.failed", "sequence_number": seq + 2, "response": failed}, newline
        ),
    ]


def passthrough_note(fatal: Unrecoverable) -> str:
    """The SSE comment left where policy "passthrough" forwards an unrecoverable call unchanged."""
    reason = fatal.reason.replace("\n", " ").replace("\r", " ")
    return f"tapfix: could not recover tool call '{fatal.name}' ({reason}); passed through unchanged"


# -- an upstream reset mid-stream ----------------------------------------------------------------
def reset_event(
    surface: Surface | None, message: str, capture_id: str, reason: str = "upstream_reset"
) -> tuple[bytes, dict[str, Any]]:
    """The retryable error each SDK raises on, in the stream's own framing (clients.md §8):
    (the bytes to send, the error object to record). `reason` is tapfix's own word for the cause."""
    return api_surface(surface).reset_events(message, {"reason": reason, "capture_id": capture_id})
