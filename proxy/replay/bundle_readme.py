"""The README.md of a bug-report bundle: the exchange told for a maintainer who was not there.

Server, model, the parameters in effect (as forwarded, after tapfix's changes), what tapfix
changed, what went wrong (status, transport error, degeneration flags), an excerpt of the answer,
the timings, and how to resend it. `safe_text` is the last guard before anything is written.
"""

from __future__ import annotations

import os
import re
from typing import Any

import orjson
from tapfix.proxy.store.redact import REDACTED, redact_text

FLAG_HELP = {
    "script_drift": "the answer starts in Latin script and drifts into a long CJK run "
    "(often a wrong chat template or a broken quantization)",
    "repetition_loop": "the answer repeats the same lines or phrases over and over",
    "runaway_length": "generation stopped at the token limit (finish_reason `length`)",
    "empty_answer": "the answer has no content, no reasoning and no tool call",
    "invalid_tool_call": "a tool call's arguments don't parse or don't match the tool's JSON Schema",
    "stream_incomplete": "the stream ended without `data: [DONE]`",
}
_FILES = {
    "request.json": "the client's request body, exact bytes",
    "forwarded.json": "the body tapfix sent upstream (differs from the client's), exact bytes",
    "response.sse": "the upstream's raw response, exact bytes",
    "response.json": "the upstream's raw response, exact bytes",
    "client_response.sse": "what the client received after tapfix's repairs",
    "client_response.json": "what the client received after tapfix's repairs",
    "exchange.json": "the capture's metadata (times, model, status, flags, usage)",
    "headers.json": "request, forwarded and response headers, without any credential",
    "changes.json": "every change tapfix made, with the reason",
    "timing.json": "first byte, first token, duration, and each chunk's arrival (ms) and size",
    "flags.json": "the degeneration and fault flags",
    "repro.sh": "resend the forwarded body with curl, byte for byte",
    "repro.py": "resend the forwarded body with Python (httpx), byte for byte",
    "README.md": "this file",
}
_ENV_SECRET = re.compile(r"key|token|secret|password|passwd|credential|auth", re.I)
_SKIP_PARAMS = {"messages", "tools", "model", "stream", "input", "prompt", "system"}


def safe_text(text: str) -> str:
    """Redact key-looking values and the value of any secret-named environment variable."""
    for name, value in os.environ.items():
        if len(value) >= 8 and _ENV_SECRET.search(name) and value in text:
            text = text.replace(value, REDACTED)
    return redact_text(text)


def bundle_readme(capture: dict[str, Any], forwarded: bytes, response: bytes, files: list[str]) -> str:
    request = _object(forwarded)
    out = [f"# tapfix capture {capture['id']}", ""]
    out.append(
        f"`{capture.get('method') or 'POST'} {capture.get('path') or ''}` "
        f"to `{capture.get('upstream_url') or '?'}`"
        f" at {capture.get('started_at')}: HTTP {capture.get('status') or 'no response'}, "
        f"finish_reason `{capture.get('finish_reason') or '-'}`."
    )
    out += ["", "## Server", ""]
    server = next((v for k, v in capture.get("response_headers") or [] if str(k).lower() == "server"), None)
    out.append(f"- upstream: `{capture.get('upstream_url') or '?'}`" + (f" (server: `{server}`)" if server else ""))
    out.append(
        f"- model requested: `{capture.get('model') or request.get('model') or '?'}`"
        + (f", served as `{capture['served_model']}`" if capture.get("served_model") else "")
    )
    if capture.get("user_agent"):
        out.append(f"- client: `{capture['user_agent']}`")
    out += ["", "## Request", ""]
    messages = request.get("messages") if isinstance(request.get("messages"), list) else None
    out.append(
        f"- {len(messages) if messages is not None else '?'} messages, stream: "
        f"{'yes' if capture.get('stream') else 'no'}, {capture.get('request_size') or 0} bytes"
    )
    tools = request.get("tools") if isinstance(request.get("tools"), list) else []
    if tools:
        names = [str((t.get("function") or t).get("name")) for t in tools if isinstance(t, dict)]
        out.append(f"- tools: {', '.join(f'`{n}`' for n in names)}")
    params = {k: v for k, v in request.items() if k not in _SKIP_PARAMS}
    out += ["", "Parameters in effect (as forwarded upstream):", ""]
    out += [f"- `{k}`: `{_short(v)}`" for k, v in params.items()] or ["- none besides the messages (server defaults)"]
    changes = capture.get("change_rows") or []
    if changes:
        out += [
            "",
            "Changes tapfix made:",
            "",
            "| stage | kind | path | before | after | reason |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        out += [
            f"| {c.get('stage')} | {c.get('kind')} | {c.get('path') or ''} | {_short(c.get('before'), 40)} | "
            f"{_short(c.get('after'), 40)} | {c.get('reason') or ''} |"
            for c in changes
        ]
    out += ["", "## What went wrong", ""]
    out += _problems(capture, response)
    out += ["", "## Response", ""]
    content = capture.get("content") or ""
    out.append(f"- finish_reason: `{capture.get('finish_reason') or '-'}`, usage: `{_short(capture.get('usage'))}`")
    for call in capture.get("tool_calls") or []:
        out.append(f"- tool call `{call.get('name')}`: `{_short(call.get('arguments'), 300)}`")
    if content:
        excerpt = content if len(content) <= 1500 else content[:1000] + "\n…\n" + content[-400:]
        out += ["", "```text", excerpt.replace("```", "'''"), "```"]
    out += ["", "## Timing", ""]
    out.append(
        f"- first byte {_ms(capture.get('upstream_first_byte_ms'))}, first token "
        f"{_ms(capture.get('first_token_ms'))}, total {_ms(capture.get('duration_ms'))}, "
        f"{capture.get('chunk_count') or 0} chunks"
    )
    out += [
        "",
        "## Reproduce",
        "",
        "```sh",
        "bash repro.sh            # or: python repro.py",
        "TAPFIX_UPSTREAM=http://127.0.0.1:8000 bash repro.sh   # another server",
        "```",
        "",
        "No credential is included: set `TAPFIX_API_KEY` if the server needs one.",
        "",
        "## Files",
        "",
    ]
    out += [f"- `{name}`: {_FILES.get(name, '')}" for name in files]
    return "\n".join(out) + "\n"


def _problems(capture: dict[str, Any], response: bytes) -> list[str]:
    lines: list[str] = []
    status = capture.get("status")
    if status is None:
        lines.append("- no response from the server" + (f": {capture['error']}" if capture.get("error") else ""))
    elif status >= 400:
        lines.append(f"- the server answered HTTP {status}: `{_short(response.decode('utf-8', 'replace'), 300)}`")
    elif capture.get("error"):
        lines.append(f"- transport error: {capture['error']}")
    for flag in capture.get("flags") or []:
        lines.append(f"- `{flag}`: {FLAG_HELP.get(flag, 'see tapfix docs')}")
    return lines or ["- nothing was flagged: describe what you expected instead."]


def _object(body: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    text = " ".join(text.split()).replace("|", "\\|").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value):.0f} ms"
