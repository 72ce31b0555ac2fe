"""The scripted model's answer once a tool has answered: a closing word that says what really happened.

The result is read as a model would (`reading.ToolResult`): a call that failed is reported as failed,
with the tool's own words, never as done; a call refused for a relative path is made again with the
path under the working directory, once (the retry's path is absolute, so it can't loop); images in the
result (a screenshot, a read PNG) are looked at like images in a prompt.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from tapfix.proxy.mock.chat import ToolCall
from tapfix.proxy.mock.jsonish import obj
from tapfix.proxy.mock.reading import ToolResult, absolute
from tapfix.proxy.mock.schema_args import PATH_NAMES, prop_key
from tapfix.proxy.mock.vision import decode_data_url, dominant_colour

_PATH_KEYS = PATH_NAMES - {"dir", "directory", "target"}


def last_call(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The function of the assistant's last tool call (`{name, arguments}`), or {}."""
    for m in reversed(messages):
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list) and m["tool_calls"]:
            return obj(obj(m["tool_calls"][-1]).get("function"))
    return {}


def retry_with_absolute_path(
    call: dict[str, Any], result: ToolResult, workdir: str | None, call_id: str
) -> ToolCall | None:
    """The same call with its relative path made absolute, when the tool refused it for being relative."""
    failure = result.failure
    if workdir is None or failure is None or not re.search(r"\babsolute\b", failure, re.I):
        return None
    args = _arguments(call)
    key = next((k for k, v in args.items() if prop_key(k) in _PATH_KEYS and isinstance(v, str)), None)
    if key is None or args[key].startswith("/"):
        return None
    fixed = {**args, key: absolute(args[key], workdir)}
    return ToolCall(call_id, str(call.get("name") or "tool"), json.dumps(fixed, ensure_ascii=False))


def closing_answer(call: dict[str, Any], result: ToolResult) -> str:
    """A short closing answer about the last tool call and its result."""
    name = str(call.get("name") or "tool")
    args = _arguments(call)
    raw = call.get("arguments") if isinstance(call.get("arguments"), str) else ""
    path = next((str(v) for k, v in args.items() if prop_key(k) in _PATH_KEYS), None)
    failure = result.failure
    if failure is not None:
        what = f" on {path}" if path else ""
        return f"The {name} call{what} failed: {failure} I could not finish the task."
    seen = _look_at(result.images)
    if seen:
        return seen
    text = " ".join(v for v in (raw, *args.values()) if isinstance(v, str))
    command = args.get("command") or args.get("cmd")
    if isinstance(command, list):  # an argv: ["bash", "-lc", "..."]
        command = command[-1] if command and all(isinstance(c, str) for c in command) else None
    added = re.search(r"^\*\*\* Add File: (.+)$", text, re.M)
    created = added or (re.search(r"printf .*> *'?([^'\s;&|]+)'?$", command) if isinstance(command, str) else None)
    low = name.lower()
    output = result.text.strip()
    if created:
        return f"Done. I created {created.group(1).strip()} with the requested content."
    updated = re.search(r"^\*\*\* Update File: (.+)$", text, re.M)
    if updated:
        return f"Done. I edited {updated.group(1).strip()}."
    if ("write" in low or "create" in low) and "stdin" not in low:
        return f"Done. I created {path or 'the file'} with the requested content."
    if "read" in low or "view" in low or "cat" in low:
        snippet = output[:200]
        return (
            f"Here is what {path or 'the file'} contains:\n\n{snippet}"
            if snippet
            else f"{path or 'The file'} is empty."
        )
    if "edit" in low or "replace" in low:
        return f"Done. I edited {path or 'the file'}."
    if command:
        return f"The command `{command}` finished." + (f" Output:\n\n{output[:200]}" if output else "")
    return f"Done. The {name} call completed."


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    raw = call.get("arguments")
    if isinstance(raw, dict):
        return raw
    try:
        args = orjson.loads(raw or "{}") if isinstance(raw, str) else {}
    except orjson.JSONDecodeError:
        return {}
    return args if isinstance(args, dict) else {}


def _look_at(images: list[str]) -> str | None:
    """What the result's images show (their dominant colour), as the prompt's images are described."""
    if not images:
        return None
    data = next((d for d in (decode_data_url(u) for u in images) if d), None)
    colour = dominant_colour(data) if data else None
    if colour is None:
        return "The tool returned an image, but I can't make out its colours."
    return f"The tool returned an image. The image is mostly {colour}."
