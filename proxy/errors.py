"""Every error tapfix itself emits, in the shape each client reads: one place to keep them agreeing.

Two families:

- **Answers instead of forwarding** (`request_error`, `unauthorized`, `upstream_unreachable`): an
  OpenAI error object `{"error": {"message", "type", "param", "code"}}`, which every agent
  surfaces as is. A 4xx is `invalid_request_error`, so agents stop instead of retrying.
- **Errors inside a response** (a tool call tapfix can't recover, an upstream reset mid-stream): in
  the stream's own framing per surface, worded so agents retry or stop as the policy wants. Agents
  decide from the words alone (clients.md §8): policy "error" carries all three retry signals
  (server-error words, a numeric 5xx code, "server error" in the message) so opencode, omp and pi
  regenerate the turn; "fail_fast" carries none of them, in any field, so every agent stops.

The mock's engine-style errors live in `tapfix.proxy.mock`, never here: the mock plays engines.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

import orjson
from tapfix.proxy.config.settings import ToolRepairPolicy
from tapfix.proxy.sse import format_event, named_event
from tapfix.proxy.surfaces import Surface

TOOL_CALL_UNRECOVERABLE = "tool_call_unrecoverable"
# What opencode, omp and pi read as "transient, retry": kept out of every fail_fast field.
_TRANSIENT = re.compile(
    r"server[ _]error|unavailable|timeout|timed out|internal|overloaded|exhausted|terminated|try again|"
    r"connection|network|fetch failed|upstream connect|rate limit|429|5\d\d",
    re.I,
)


# -- answers instead of forwarding --------------------------------------------------------------
def error_json(message: str, kind: str, code: str | None = None, param: str | None = None) -> bytes:
    """OpenAI's error object. json, not orjson: a model name may hold a lone surrogate escape,
    which only ASCII output can carry."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


def request_error(status: int, message: str, code: str, param: str | None = None) -> tuple[int, bytes]:
    """A 4xx `invalid_request_error` (status, body): the request can't be served as sent."""
    return status, error_json(message, "invalid_request_error", code, param)


def internal_error(message: str) -> tuple[int, bytes]:
    """A 500: tapfix itself failed on this request and can't tell where to forward it."""
    return 500, error_json(message, "tapfix_error", "internal")


def unauthorized(message: str) -> bytes:
    """The 401 body OpenAI-compatible clients recognise as a bad key (`invalid_api_key`): they stop."""
    return error_json(message, "invalid_request_error", "invalid_api_key")


def upstream_unreachable(message: str) -> bytes:
    """The 502 body when the upstream refuses connections (never mitmproxy's HTML page)."""
    return error_json(message, "upstream_unreachable")


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
    tapfix = {"reason": reason, "capture_id": capture_id}
    if surface == "messages":
        error: dict[str, Any] = {"type": "api_error", "message": message}
        return named_event("error", {"type": "error", "error": error}), error
    error = {"message": message, "type": "server_error", "code": 502, "tapfix": tapfix}
    if surface == "responses":
        return named_event(
            "error", {"type": "error", "code": "server_error", "message": message, "error": error, "sequence_number": 0}
        ), error
    return format_event(orjson.dumps({"error": error})) + format_event(b"[DONE]"), error
