"""`tapfix captures show`: a readable view of one exchange."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import orjson
from tapfix.proxy.cli.prefix_view import cached_prompt_tokens, excerpt_lines, prefix_line
from tapfix.proxy.store.answered import answered_by_tapfix, destination, tapfix_error, upstream_error
from tapfix.proxy.store.reader import body_id_of

if TYPE_CHECKING:
    from tapfix.proxy.store.reader import CaptureReader


def _pretty(body: bytes, limit: int = 4000) -> str:
    if not body:
        return "(empty)"
    try:
        text = orjson.dumps(orjson.loads(body), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", errors="replace")
    if len(text) > limit:
        text = text[:limit] + f"\n… ({len(text) - limit} more characters; `tapfix captures export` gives all)"
    return text


def _value(value: Any) -> str:
    return orjson.dumps(value).decode() if not isinstance(value, str) else repr(value)


def render_capture(reader: CaptureReader, capture: dict[str, Any]) -> str:
    c = capture
    lines = [
        f"capture {c['id']}  {c['started_at']}",
        f"  connection record: a request head that didn't parse; its first {c.get('request_size') or 0} bytes are"
        " the request body (`captures export --request`)"
        if "connection" in (c.get("tags") or [])
        else f"  {c['method']} {c['path']}  →  {destination(c)}",
        f"  client: {c.get('user_agent') or '-'} ({c.get('client_addr') or '-'})"
        f"   session: {c.get('session_id') or '-'}" + (f"   thread: {c['thread_id']}" if c.get("thread_id") else ""),
        f"  model: {c.get('model') or '-'}"
        + (f" → served as {c['served_model']}" if c.get("served_model") not in (None, c.get("model")) else ""),
        f"  status: {c.get('status') or '-'}   stream: {'yes' if c.get('stream') else 'no'}"
        f"   finish_reason: {c.get('finish_reason') or '-'}",
        f"  timings: first byte {_ms(c.get('upstream_first_byte_ms'))}, first token {_ms(c.get('first_token_ms'))},"
        f" total {_ms(c.get('duration_ms'))}, {c.get('chunk_count') or 0} chunks",
    ]
    lines += route_lines(c.get("route_decision"))
    if c.get("flags"):
        lines.append(f"  flags: {', '.join(c['flags'])}")
    if c.get("tags"):
        lines.append(f"  tags: {', '.join(c['tags'])}")
    if c.get("error"):
        lines += _error_lines(c)
    if c.get("source_id"):
        lines.append(f"  replay of: {c['source_id']}")
    if c.get("attempt_of"):
        lines.append(f"  attempt {c.get('attempt')} of: {c['attempt_of']}")
    if c.get("trace_id"):  # W3C trace context: ids as a tracing backend shows them
        span, parent = c.get("span_id") or "-", c.get("parent_span_id") or "-"
        lines.append(f"  trace: {c['trace_id']}   span: {span}   parent span: {parent}")
    prefix = prefix_line(c, _cached(reader, c))
    lines += [prefix, *excerpt_lines(c)] if prefix else []
    lines.append("")
    lines.append(f"changes ({len(c['change_rows'])}):")
    for ch in c["change_rows"]:
        lines.append(
            f"  [{ch['stage']}] {ch['kind']} {ch['path']}: {_value(ch['before'])} → {_value(ch['after'])}"
            + (f"  ({ch['reason']})" if ch.get("reason") else "")
        )
    if not c["change_rows"] and answered_by_tapfix(c):
        lines.append("  none: tapfix answered the request itself")
    elif not c["change_rows"]:
        lines.append("  none: the request and response passed unchanged")
    request = reader.capture_body(c, "request")
    lines += ["", f"request as sent by the client ({len(request)} bytes):", _pretty(request)]
    if c.get("forwarded_body_id"):
        forwarded = reader.capture_body(c, "forwarded")
        lines += ["", f"request as forwarded upstream ({len(forwarded)} bytes):", _pretty(forwarded)]
    lines += ["", "response assembled:"]
    if c.get("reasoning"):
        lines += ["  reasoning:", _indent(c["reasoning"])]
    lines += ["  content:", _indent(c.get("content") or "(none)")]
    for call in c.get("tool_calls") or []:
        lines.append(f"  tool call {call.get('id') or '-'}: {call.get('name')}({call.get('arguments')})")
    if c.get("usage"):
        lines.append(f"  usage: {orjson.dumps(c['usage']).decode()}")
    choices = reader.read_choices(c["id"])
    if choices:
        lines += [
            "",
            f"choices ({len(choices)}; the exchange row and the answer above are choice {choices[0]['index']}):",
        ]
        for choice in choices:
            lines.append(
                f"  choice {choice['index']}: finish_reason {choice['finish_reason'] or '-'}"
                f", flags {', '.join(choice['flags']) or '-'}"
            )
            if choice.get("reasoning"):
                lines += ["    reasoning:", _indent(choice["reasoning"], prefix="      ")]
            lines += ["    content:", _indent(choice.get("content") or "(none)", prefix="      ")]
            for call in choice["tool_calls"]:
                lines.append(f"    tool call {call.get('id') or '-'}: {call.get('name')}({call.get('arguments')})")
    return "\n".join(lines)


def _cached(reader: CaptureReader, c: dict[str, Any]) -> int | None:
    has_response = body_id_of(c, "response") is not None
    return cached_prompt_tokens(c, (lambda: reader.capture_body(c, "response")) if has_response else None)


def _error_lines(c: dict[str, Any]) -> list[str]:
    error, whose = upstream_error(c), "upstream error"
    if error is None:
        error, whose = tapfix_error(c), "error tapfix answered with"
    if error is None:
        return [f"  error: {c['error']}"]
    about = [f"{key} {_plain(error[key])}" for key in ("type", "code") if error.get(key) not in (None, "")]
    message = error.get("message")
    lines = [f"  {whose}{' (' + ', '.join(about) + ')' if about else ''}:"]
    lines.append(_indent(message if isinstance(message, str) else orjson.dumps(error).decode()))
    return lines


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def route_lines(decision: Any) -> list[str]:
    """The route decision (issue 38, request/routes.py `Decision.record`), as `captures show` and
    `tapfix route explain` print it."""
    if not isinstance(decision, dict):
        return []
    slot = slot_line(decision.get("slot"))
    if "route" not in decision:  # a model without routes, its upstream's slot pinned
        return [slot] if slot else []
    inputs = decision.get("inputs") or {}
    route = decision.get("route")
    taken = f"{route} → {decision.get('upstream')}/{decision.get('served_model')}" if route else "none"
    lines = [f"  route: {taken}   matched: {decision.get('matched') or '-'}"]
    seen = f"prompt {inputs.get('prompt_tokens')} tokens ({inputs.get('prompt_source')})"
    seen += f", max_tokens {inputs.get('max_tokens')}" if inputs.get("max_tokens") else ""
    seen += f", needs {', '.join(inputs['needs'])}" if inputs.get("needs") else ""
    seen += "".join(f", header {k}: {v}" for k, v in (inputs.get("headers") or {}).items())
    lines.append(f"    inputs: {seen}")
    for r in decision.get("rejected") or []:
        lines.append(f"    rejected {r.get('route')} ({r.get('upstream')}): {r.get('reason')}")
    for a in decision.get("attempts") or []:
        lines.append(f"    attempt on {a.get('route')} ({a.get('upstream')}) failed: {a.get('reason')}")
    if decision.get("not_matched"):
        lines.append(f"    not matched: {', '.join(decision['not_matched'])}")
    return lines + ([slot] if slot else [])


def slot_line(slot: Any) -> str | None:
    """The llama.cpp slot the request was pinned to (request/slots.py), and what the slot's cache served."""
    if not isinstance(slot, dict):
        return None
    cached = slot.get("cache_n")
    served = f"; cache_n {cached:,} prompt tokens from the slot's cache" if isinstance(cached, int) else ""
    if slot.get("how") == "client":
        return f"  slot: the client's id_slot {slot.get('client_slot')!r} on {slot.get('upstream')}{served}"
    evicted = f", taken from thread {slot['evicted']}" if slot.get("evicted") else ""
    return (
        f"  slot: {slot.get('slot')} on {slot.get('upstream')} ({slot.get('how')}{evicted}), "
        f"thread {slot.get('thread')} ({slot.get('role')}){served}"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _indent(text: str, limit: int = 4000, prefix: str = "    ") -> str:
    if len(text) > limit:
        text = text[:limit] + "…"
    return "\n".join(prefix + line for line in text.splitlines() or [""])


BODIES = ("request", "forwarded", "response", "client_response")


def body_json(data: bytes) -> dict[str, str]:
    """Text when the bytes are UTF-8, else base64: either way the exact bytes come back."""
    try:
        return {"encoding": "utf-8", "text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"encoding": "base64", "data": base64.b64encode(data).decode("ascii")}


def capture_json(reader: CaptureReader, capture: dict[str, Any]) -> dict[str, Any]:
    """What `render_capture` shows, as one object (schemas/capture.schema.json). Keys are only ever added.

    Bodies are the exact bytes `captures export` writes (forwarded is the request when tapfix
    changed nothing); a body is null when the capture has none (no response, or privacy mode).
    """
    c = capture
    return {
        **{key: c.get(key) for key in _METADATA},
        "stream": None if c.get("stream") is None else bool(c["stream"]),
        "tags": list(c.get("tags") or []),
        "flags": list(c.get("flags") or []),
        "timings": {key: c.get(key) for key in _TIMINGS},
        "changes": [
            {key: ch.get(key) for key in ("stage", "kind", "path", "before", "after", "reason")}
            for ch in c["change_rows"]
        ],
        "assembled": {
            "content": c.get("content"),
            "reasoning": c.get("reasoning"),
            "tool_calls": c.get("tool_calls") or [],
            "usage": c.get("usage"),
        },
        "headers": {which: c.get(f"{which}_headers") for which in ("request", "forwarded", "response")},
        "route_decision": c.get("route_decision"),
        "upstream_error": upstream_error(c),
        "tapfix_error": tapfix_error(c),
        "choices": reader.read_choices(c["id"]),
        "prefix_break": c.get("prefix_break"),
        "cached_prompt_tokens": _cached(reader, c),
        "bodies": {
            which: body_json(reader.capture_body(c, which)) if body_id_of(c, which) is not None else None
            for which in BODIES
        },
    }


_METADATA = (
    "id",
    "started_at",
    "method",
    "path",
    "url",
    "upstream_url",
    "client_addr",
    "user_agent",
    "session_id",
    "thread_id",
    "source_id",
    "attempt_of",
    "attempt",
    "trace_id",
    "span_id",
    "parent_span_id",
    "model",
    "served_model",
    "status",
    "finish_reason",
    "error",
    "request_size",
    "response_size",
    "prompt_tokens",
    "completion_tokens",
)
_TIMINGS = ("upstream_first_byte_ms", "first_token_ms", "duration_ms", "chunk_count")
