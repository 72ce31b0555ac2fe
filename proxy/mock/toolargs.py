"""Pick the tool a prompt asks for and fill its arguments from the tool's own JSON Schema.

Real agents (opencode, omp, pi) name the same tool differently (`write` with `filePath` or `path`,
omp's extra required `i`), so nothing here knows a particular agent: the tool is chosen by name
synonyms and the arguments by property names and types. Unknown required fields still get a value
valid for their schema, so the call always validates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .jsonish import arr, obj

# (intent, pattern in the prompt, tool-name synonyms) in priority order.
_INTENTS: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    (
        "fetch",
        re.compile(r"\b(fetch|download)\b|https?://"),
        ("webfetch", "fetch", "web_fetch", "browse", "http"),
    ),
    (
        "write",
        re.compile(r"\b(create|write|make|save|generate)\b"),
        ("write", "write_file", "create_file", "create", "save", "file_write", "new_file"),
    ),
    (
        "edit",
        re.compile(r"\b(edit|modify|change|replace|update|fix|rename)\b"),
        ("edit", "str_replace", "replace", "patch", "apply_patch", "multiedit"),
    ),
    (
        "read",
        re.compile(r"\b(read|show|open|cat|display|print|view|contents?)\b"),
        ("read", "read_file", "view", "cat", "open", "file_read"),
    ),
    (
        "run",
        re.compile(r"\b(run|execute|exec|command|install|build|compile|test)\b"),
        ("bash", "shell", "exec", "execute", "run", "terminal", "command", "run_command"),
    ),
    ("list", re.compile(r"\b(list|ls)\b"), ("ls", "list", "list_dir", "list_files", "glob")),
    ("search", re.compile(r"\b(search|grep|find|locate)\b"), ("grep", "search", "rg", "glob", "find")),
]
_FALLBACK_TOOLS: dict[str, tuple[str, ...]] = {
    "list": ("bash", "shell"),
    "search": ("bash", "shell"),
    "write": ("edit",),
    "read": ("bash", "shell"),
}

_URL = re.compile(r"https?://[^\s\"'`<>)]+")
_FILE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Za-z_][\w-]*\.[A-Za-z0-9]{1,10})(?![\w/])")
_BACKTICK = re.compile(r"`([^`\n]+)`")
_QUOTED_CONTENT = re.compile(
    r"(?:containing|contains|with (?:the )?(?:text|content|contents|words?|line)|that says|saying)"
    r"\s*:?\s*[\"“'`](.+?)[\"”'`](?:\s|[.,!?]|$)",
    re.S,
)
_COMMAND_WORDS = (
    "ls",
    "echo",
    "cat",
    "pwd",
    "python",
    "python3",
    "pytest",
    "npm",
    "git",
    "make",
    "date",
    "uname",
    "whoami",
    "node",
    "go",
    "cargo",
    "uv",
    "pip",
    "grep",
    "find",
    "wc",
    "head",
    "tail",
)

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


@dataclass
class Intent:
    kind: str | None
    filename: str | None
    content: str
    command: str
    pattern: str
    url: str | None
    summary: str


def analyze(prompt: str) -> Intent:
    """What the user asks for, read with a few regular expressions."""
    low = prompt.lower()
    kind = next((name for name, pattern, _ in _INTENTS if pattern.search(low)), None)
    url_match = _URL.search(prompt)
    without_urls = _URL.sub(" ", prompt)
    filename = _find_filename(without_urls)
    content = _find_content(prompt, low, filename)
    command = _find_command(prompt, low, kind, filename)
    pattern = _find_pattern(prompt)
    verb = {
        "write": "Create",
        "edit": "Edit",
        "read": "Read",
        "run": "Run",
        "list": "List files in",
        "search": "Search for",
        "fetch": "Fetch",
    }.get(kind or "", "Handle")
    target = {
        "run": command,
        "search": pattern,
        "fetch": url_match.group() if url_match else "the page",
        "list": "the working directory",
    }.get(kind or "", filename or "the request")
    return Intent(
        kind,
        filename,
        content,
        command,
        pattern,
        url_match.group() if url_match else None,
        f"{verb} {target}",
    )


def _find_filename(text: str) -> str | None:
    for m in _BACKTICK.finditer(text):
        inner = _FILE.fullmatch(m.group(1).strip())
        if inner:
            return inner.group(1)
    for m in _FILE.finditer(text):
        name = m.group(1)
        if not re.fullmatch(r"(e\.g|i\.e|etc|vs)\.?\w*", name, re.I):
            return name.rstrip(".")
    return None


def _find_content(prompt: str, low: str, filename: str | None) -> str:
    m = _QUOTED_CONTENT.search(prompt)
    if m:
        text = m.group(1)
        return text if text.endswith("\n") else text + "\n"
    if "greeting" in low or re.search(r"\bhello\b", low):
        return "Hello, world!\n"
    if "haiku" in low or "poem" in low:
        return "An old silent pond\nA frog jumps into the pond\nSplash! Silence again.\n"
    ext = filename.rsplit(".", 1)[-1].lower() if filename else ""
    return {
        "py": 'print("Hello, world!")\n',
        "md": "# Notes\n\nThis file was created as requested.\n",
        "json": "{}\n",
        "sh": '#!/bin/sh\necho "Hello, world!"\n',
        "js": 'console.log("Hello, world!");\n',
        "html": "<!doctype html>\n<title>Hello</title>\n<p>Hello, world!</p>\n",
    }.get(ext, "This file was created as requested.\n")


def _find_command(prompt: str, low: str, kind: str | None, filename: str | None) -> str:
    for m in _BACKTICK.finditer(prompt):
        words = m.group(1).split()
        if words and words[0] in _COMMAND_WORDS:
            return m.group(1).strip()
    run = re.search(r"\b(?:run|execute)\s+(?:the\s+command\s+)?[\"']?([a-z0-9][^\"'\n.?!]*)", low)
    if run and run.group(1).split()[0] in _COMMAND_WORDS:
        return prompt[run.start(1) : run.end(1)].strip()
    if kind == "read" and filename:
        return f"cat {filename}"
    if kind == "list":
        return "ls -la"
    if kind == "search":
        return f"grep -rn {_find_pattern(prompt)} ."
    return "ls"


def _find_pattern(prompt: str) -> str:
    m = re.search(r"[\"“'`]([^\"”'`\n]{1,60})[\"”'`]", prompt) or re.search(r"\bfor\s+([\w.-]+)", prompt)
    return m.group(1) if m else "TODO"


def tool_name(tool: dict[str, Any]) -> str:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else ""


def tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    params = fn.get("parameters") if isinstance(fn, dict) else None
    return params if isinstance(params, dict) else {"type": "object", "properties": {}}


def _score(name: str, synonyms: tuple[str, ...]) -> int:
    low = name.lower().lstrip("_")
    parts = set(re.split(r"[^a-z0-9]+|_", low))
    best = 0
    for rank, syn in enumerate(synonyms):
        bonus = len(synonyms) - rank
        if low == syn:
            best = max(best, 300 + bonus)
        elif syn in parts:
            best = max(best, 200 + bonus)
        elif syn in low:
            best = max(best, 100 + bonus)
    return best


def pick_tool(tools: list[dict[str, Any]], intent: Intent, required: bool) -> dict[str, Any] | None:
    """The best-fitting tool for the intent; with `required`, the first tool when none fits."""
    tools = [t for t in tools if isinstance(t, dict) and tool_name(t)]
    if not tools:
        return None
    if intent.kind is not None:
        synonyms = next(s for name, _, s in _INTENTS if name == intent.kind)
        for group in (synonyms, _FALLBACK_TOOLS.get(intent.kind, ())):
            scored = [(_score(tool_name(t), group), -i, t) for i, t in enumerate(tools)]
            best = max(scored, key=lambda item: (item[0], item[1]))
            if best[0] > 0:
                return best[2]
    return tools[0] if required else None


def build_arguments(schema: dict[str, Any], intent: Intent) -> dict[str, Any]:
    """Arguments for a tool call, valid against `schema` as far as the mock can tell."""
    value = _value("", schema, intent, top=True, depth=0)
    return value if isinstance(value, dict) else {}


def _norm(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def _pick_schema(schema: Any) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            usable = [o for o in options if isinstance(o, dict) and o.get("type") != "null"]
            merged = {k: v for k, v in schema.items() if k != key}
            return {**merged, **_pick_schema(usable[0] if usable else options[0])}
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            merged.update(_pick_schema(part))
        return merged
    return schema


def _type(schema: dict[str, Any]) -> str:
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
    schema = _pick_schema(raw_schema)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = _type(schema)
    key = _norm(name)
    if kind == "object":
        props = obj(schema.get("properties"))
        required = [r for r in arr(schema.get("required")) if isinstance(r, str)]
        out: dict[str, Any] = {}
        for prop, sub in props.items():
            wanted = prop in required or (top and _norm(prop) in PATH_NAMES | CONTENT_NAMES | COMMAND_NAMES)
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
        return [
            _value(name.rstrip("s"), schema.get("items", {}), intent, False, depth + 1) for _ in range(count)
        ]
    if kind == "boolean":
        default = schema.get("default")
        return default if isinstance(default, bool) else False
    if kind in ("integer", "number"):
        return _number(key, schema, kind)
    if kind == "null":
        return None
    return _string(name, schema, intent)


def _number(key: str, schema: dict[str, Any], kind: str) -> int | float:
    default = schema.get("default")
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return default
    value: float = 120000 if "timeout" in key else 1
    for bound in ("minimum", "exclusiveMinimum"):
        low = schema.get(bound)
        if isinstance(low, (int, float)) and value <= low:
            value = low + (1 if bound == "exclusiveMinimum" else 0)
    for bound in ("maximum", "exclusiveMaximum"):
        high = schema.get(bound)
        if isinstance(high, (int, float)) and value >= high:
            value = high - (1 if bound == "exclusiveMaximum" else 0)
    return int(value) if kind == "integer" else float(value)


def _string(name: str, schema: dict[str, Any], intent: Intent) -> str:
    key = _norm(name)
    if key in PATH_NAMES:
        directory = key in {"dir", "directory"} or intent.kind in ("list", "search")
        text = intent.filename or ("." if directory else "README.md")
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
