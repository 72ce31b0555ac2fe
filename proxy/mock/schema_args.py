"""Arguments valid for a tool's own JSON Schema, filled from what the prompt asked (`prompt_intent.Intent`).

Nothing here knows a particular agent: properties are matched by name (lower-cased without `_` and
`-`, so filePath, file_path and filepath are one) and type, `anyOf`/`oneOf`/`allOf` are resolved to one
usable branch, and every required field gets a value valid for its schema (bounds, enums, lengths), so
the call always validates. Apart from the tool picking (`toolargs.py`), which only reads schemas.
"""

from __future__ import annotations

import math
import re
from typing import Any

from tapfix.proxy.mock.jsonish import arr, obj
from tapfix.proxy.mock.prompt_intent import Intent
from tapfix.proxy.mock.reading import absolute, wants_absolute

# Enum values to prefer, per intent, for an action-like property (`command: view|create|str_replace`).
ACTION_KEYS = {"command", "action", "operation", "op", "mode", "cmd"}
ACTION_VALUES: dict[str, tuple[str, ...]] = {
    "write": ("create", "write", "add", "new"),
    "edit": ("str_replace", "replace", "edit", "update", "modify", "patch"),
    "read": ("view", "read", "cat", "show", "open"),
    "list": ("list", "ls", "view"),
    "search": ("search", "grep", "find"),
    "run": ("run", "exec", "execute"),
    "fetch": ("fetch", "get", "markdown"),
}
# Number descriptions that ask for a fraction rather than a count.
_FRACTION = re.compile(r"\b(fraction(al)?|decimal|probability|ratio|between 0(\.0)? and 1(\.0)?)\b", re.I)

# Property names, compared lower-cased without `_` and `-` (filePath, file_path and filepath are one).
PATH_NAMES = {
    "path",
    "filepath",
    "filename",
    "file",
    "targetfile",
    "absolutepath",
    "target",
    "dir",
    "directory",
}
CONTENT_NAMES = {
    "content",
    "contents",
    "text",
    "body",
    "data",
    "filetext",
    "newstring",
    "newtext",
    "newstr",
    "code",
}
OLD_TEXT_NAMES = {"oldstring", "oldtext", "oldstr", "searchtext"}
COMMAND_NAMES = {"command", "cmd", "script", "shellcommand"}
PATTERN_NAMES = {"pattern", "query", "regex", "glob", "search", "q"}
INTENT_NAMES = {"i", "intent", "description", "reason", "explanation", "title", "summary", "purpose"}
PATCH_NAMES = {"input", "patch", "diff", "patchtext"}


def build_arguments(schema: dict[str, Any], intent: Intent) -> dict[str, Any]:
    """Arguments for a tool call, valid against `schema` as far as the mock can tell."""
    value = _value("", schema, intent, top=True, depth=0)
    return value if isinstance(value, dict) else {}


def prop_key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def pick_schema(schema: Any) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            usable = [o for o in options if isinstance(o, dict) and o.get("type") != "null"]
            merged = {k: v for k, v in schema.items() if k != key}
            return {**merged, **pick_schema(usable[0] if usable else options[0])}
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            merged.update(pick_schema(part))
        return merged
    return schema


def schema_type(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if isinstance(kind, str):
        return kind
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _value(name: str, raw_schema: Any, intent: Intent, top: bool, depth: int) -> Any:
    schema = pick_schema(raw_schema)
    if "const" in schema:
        return schema["const"]
    kind = schema_type(schema)
    key = prop_key(name)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return _enum_value(key, schema["enum"], intent)
    if kind == "object":
        props = obj(schema.get("properties"))
        required = [r for r in arr(schema.get("required")) if isinstance(r, str)]
        out: dict[str, Any] = {}
        for prop, sub in props.items():
            wanted = prop in required or (top and prop_key(prop) in PATH_NAMES | CONTENT_NAMES | COMMAND_NAMES)
            if wanted and depth < 6:
                out[prop] = _value(prop, sub, intent, top=False, depth=depth + 1)
        for prop in required:  # required but undeclared: a string is the best guess
            out.setdefault(prop, _string(prop, {}, intent))
        return out
    if kind == "array":
        min_items = schema.get("minItems")
        count = min_items if isinstance(min_items, int) else 0
        if count == 0 and key in {"paths", "files", "filepaths"} and intent.filename:
            return [intent.filename]
        items = pick_schema(schema.get("items", {}))
        if key in COMMAND_NAMES and schema_type(items) == "string" and "enum" not in items:
            return ["bash", "-lc", intent.command]  # an argv (Codex's `shell`): run it through bash
        return [_value(name.rstrip("s"), schema.get("items", {}), intent, False, depth + 1) for _ in range(count)]
    if kind == "boolean":
        default = schema.get("default")
        return default if isinstance(default, bool) else False
    if kind in ("integer", "number"):
        return _number(key, schema, kind)
    if kind == "null":
        return None
    return _string(name, schema, intent)


def _enum_value(key: str, values: list[Any], intent: Intent) -> Any:
    """The first enum value, or for an action-like field the one the intent asks for (`create`)."""
    if key in ACTION_KEYS and intent.kind in ACTION_VALUES:
        for wanted in ACTION_VALUES[intent.kind]:
            if wanted in values:
                return wanted
    return values[0]


def _number(key: str, schema: dict[str, Any], kind: str) -> int | float:
    """A value inside the bounds; whole (`1`, not `1.0`) unless the schema asks for a fraction.

    JSON Schema's `number` includes integers, and clients often declare ids and counts as `number`
    while parsing them as integers (Codex reads `write_stdin.session_id` as an i32).
    """
    default = schema.get("default")
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return default
    step = schema.get("multipleOf")
    step = step if isinstance(step, (int, float)) and not isinstance(step, bool) and step > 0 else None
    fraction = kind == "number" and (
        (step is not None and step != int(step)) or bool(_FRACTION.search(str(schema.get("description") or "")))
    )
    value: float = 120000 if "timeout" in key else 0.5 if fraction else 1
    for bound in ("minimum", "exclusiveMinimum"):
        low = schema.get(bound)
        if isinstance(low, (int, float)) and not isinstance(low, bool) and value <= low:
            value = low + (1 if bound == "exclusiveMinimum" else 0)
    for bound in ("maximum", "exclusiveMaximum"):
        high = schema.get(bound)
        if isinstance(high, (int, float)) and not isinstance(high, bool) and value >= high:
            value = high - (1 if bound == "exclusiveMaximum" else 0)
    if step is not None:
        value = math.ceil(value / step - 1e-9) * step
        if step != int(step):
            value = round(value, 10)
    if kind == "integer" or (value == int(value) and not fraction):
        return int(value) if value == int(value) else math.ceil(value)
    return float(value)


def _string(name: str, schema: dict[str, Any], intent: Intent) -> str:
    key = prop_key(name)
    if key in PATH_NAMES:
        directory = key in {"dir", "directory"} or intent.kind in ("list", "search")
        text = intent.filename or ("." if directory else "README.md")
        if intent.absolute_paths or wants_absolute(schema.get("description")):
            text = absolute(text, intent.workdir)  # under the working directory the client declared
    elif key in CONTENT_NAMES:
        text = intent.content
    elif key in COMMAND_NAMES:
        text = intent.command
    elif key in PATTERN_NAMES:
        text = "**/*" if key == "glob" else intent.pattern
    elif key in {"url", "uri", "link"} or schema.get("format") == "uri":
        text = intent.url or "https://example.com/"
    elif key in INTENT_NAMES:
        text = intent.summary
    elif key in OLD_TEXT_NAMES:
        text = "Hello"
    else:
        default = schema.get("default")
        text = default if isinstance(default, str) else intent.summary if key.endswith("name") else "example"
    min_len = schema.get("minLength")
    if isinstance(min_len, int) and len(text) < min_len:
        text = text + "x" * (min_len - len(text))
    max_len = schema.get("maxLength")
    if isinstance(max_len, int) and len(text) > max_len:
        text = text[:max_len]
    return text
