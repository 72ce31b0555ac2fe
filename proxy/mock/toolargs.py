"""Pick the tool a prompt asks for and fill its arguments from the tool's own JSON Schema.

Real agents (opencode, omp, pi) name the same tool differently (`write` with `filePath` or `path`,
omp's extra required `i`), so nothing here knows a particular agent: the tool is chosen by name
synonyms and the arguments by property names and types. Unknown required fields still get a value
valid for their schema, so the call always validates.

A file-creation prompt goes to a file-writing tool (one with a path field), else an editor whose
action enum has `create`, else a patch tool (Codex's `apply_patch`, answered with an `*** Add File:`
patch), else a shell tool with a command that writes the file; tools about another topic (stdin
sessions, plans, todos, images, MCP resources, sub-agents) are never picked unless the prompt names
that topic, so `write_stdin` is no "write" tool.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Any

from tapfix.proxy.mock.jsonish import arr, obj

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
# Shell tools: opencode/pi/omp `bash`, Codex `exec_command` / `shell` / `shell_command`, others.
SHELL_TOOLS = (
    "bash",
    "shell",
    "exec_command",
    "shell_command",
    "run_command",
    "run_terminal_cmd",
    "exec",
    "execute",
    "terminal",
    "run",
    "command",
)
_FALLBACK_TOOLS: dict[str, tuple[str, ...]] = {
    "list": SHELL_TOOLS,
    "search": SHELL_TOOLS,
    "read": SHELL_TOOLS,
}
_EDIT_TOOLS = ("edit", "str_replace", "replace", "multiedit", "editor", "edit_file")
_PATCH_TOOLS = ("apply_patch", "patch", "apply_diff", "diff")
# A tool about one of these topics is for that topic only: `write_stdin` (Codex) writes to a running
# command's stdin, `todowrite` writes a todo list, `view_image` shows an image, `update_plan` ...
_TOPICS = ("stdin", "session", "plan", "todo", "image", "screenshot", "agent", "mcp", "resource", "question")
# Enum values to prefer, per intent, for an action-like property (`command: view|create|str_replace`).
_ACTION_KEYS = {"command", "action", "operation", "op", "mode", "cmd"}
_ACTION_VALUES: dict[str, tuple[str, ...]] = {
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
PATCH_NAMES = {"input", "patch", "diff", "patchtext"}


@dataclass
class Intent:
    kind: str | None
    filename: str | None
    content: str
    command: str
    pattern: str
    url: str | None
    summary: str
    patch: str = ""  # the apply_patch text for a write (Add File) or an edit (Update File)
    prompt: str = ""  # the prompt, lower-cased (a tool about a topic is only used when it is named)


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
        patch=_patch(kind, filename or "README.md", content),
        prompt=low,
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
    if kind == "write":
        return create_command(filename or "README.md", _find_content(prompt, low, filename))
    if kind == "read" and filename:
        return f"cat {filename}"
    if kind == "list":
        return "ls -la"
    if kind == "search":
        return f"grep -rn {_find_pattern(prompt)} ."
    return "ls"


def create_command(filename: str, content: str) -> str:
    """A POSIX shell command that writes `content` to `filename`: `printf 'Hello, world!\\n' > hello.txt`."""
    text = content.replace("\\", "\\\\").replace("%", "%%").replace("\n", "\\n")
    quoted = "'" + text.replace("'", "'\\''") + "'"
    dash = "-- " if content.startswith("-") else ""
    command = f"printf {dash}{quoted} > {shlex.quote(filename)}"
    directory = posixpath.dirname(filename)
    return f"mkdir -p {shlex.quote(directory)} && {command}" if directory else command


def _patch(kind: str | None, filename: str, content: str) -> str:
    """Codex's apply_patch format: a new file for a write, else a one-hunk update of the file."""
    added = "".join(f"+{line}\n" for line in content.splitlines() or [""])
    if kind == "edit":
        body = f"*** Update File: {filename}\n@@\n-Hello\n{added}"
    else:
        body = f"*** Add File: {filename}\n{added}"
    return f"*** Begin Patch\n{body}*** End Patch"


def _find_pattern(prompt: str) -> str:
    m = re.search(r"[\"“'`]([^\"”'`\n]{1,60})[\"”'`]", prompt) or re.search(r"\bfor\s+([\w.-]+)", prompt)
    return m.group(1) if m else "TODO"


def _fn(tool: dict[str, Any]) -> dict[str, Any]:
    """The function object: chat's nested `function`, or the tool itself (Responses, flat)."""
    fn = tool.get("function")
    return fn if isinstance(fn, dict) else tool


def tool_name(tool: dict[str, Any]) -> str:
    name = _fn(tool).get("name")
    return name if isinstance(name, str) else ""


def tool_description(tool: dict[str, Any]) -> str:
    text = _fn(tool).get("description")
    return text if isinstance(text, str) else ""


def tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    params = _fn(tool).get("parameters")
    return params if isinstance(params, dict) else {"type": "object", "properties": {}}


def is_custom(tool: dict[str, Any]) -> bool:
    """A Responses custom (freeform) tool: its input is plain text, not JSON (Codex's apply_patch)."""
    return tool.get("type") == "custom"


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


def _words(name: str) -> set[str]:
    """`session_id`, `sessionId` -> {session, id}."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w}


def _props(tool: dict[str, Any]) -> dict[str, Any]:
    return obj(_pick_schema(tool_schema(tool)).get("properties"))


def _off_topic(tool: dict[str, Any], prompt: str) -> bool:
    """The tool is about a topic (stdin, plan, todo, image...) the prompt does not mention."""
    name = tool_name(tool).lower()
    required = [r for r in arr(_pick_schema(tool_schema(tool)).get("required")) if isinstance(r, str)]
    words = set().union(*(_words(r) for r in required)) if required else set()
    for topic in _TOPICS:
        if (topic in name or topic in words) and not re.search(rf"\b{topic}", prompt):
            return True
    return False


def _has_prop(tool: dict[str, Any], names: set[str]) -> bool:
    return any(_norm(prop) in names for prop in _props(tool))


def _is_patch_tool(tool: dict[str, Any]) -> bool:
    if _score(tool_name(tool), _PATCH_TOOLS) >= 200:
        return True
    grammar = obj(tool.get("format")).get("definition")
    text = tool_description(tool) + (grammar if isinstance(grammar, str) else "")
    return "*** Begin Patch" in text or "*** Add File" in text


def _acts(tool: dict[str, Any], wanted: tuple[str, ...]) -> bool:
    """The tool has an action-like enum (`command: view|create|str_replace`) with one of `wanted`."""
    for prop, sub in _props(tool).items():
        values = _pick_schema(sub).get("enum")
        if _norm(prop) in _ACTION_KEYS and isinstance(values, list) and any(w in values for w in wanted):
            return True
    return False


def _creates(tool: dict[str, Any]) -> bool:
    """An editor that can also create a file: an action enum with `create`/`write`, or says so."""
    if _acts(tool, ("create", "write")):
        return True
    return bool(re.search(r"\b(create|creates|creating)\b[^.]{0,40}\bfiles?\b", tool_description(tool), re.I))


def _best(tools: list[dict[str, Any]], synonyms: tuple[str, ...], keep: Any = None) -> dict[str, Any] | None:
    """The tool whose name fits `synonyms` best (first offered wins ties), among those `keep` accepts."""
    best: tuple[int, int, dict[str, Any]] | None = None
    for i, tool in enumerate(tools):
        score = _score(tool_name(tool), synonyms)
        if score > 0 and (keep is None or keep(tool)) and (best is None or (score, -i) > best[:2]):
            best = (score, -i, tool)
    return best[2] if best else None


def _shell(tool: dict[str, Any]) -> bool:
    return not is_custom(tool) and _has_prop(tool, COMMAND_NAMES)


def _pick_writer(tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    """For a file-creation prompt: a write tool, an editor that creates, apply_patch, a shell, an editor."""
    synonyms = next(s for name, _, s in _INTENTS if name == "write")
    functions = [t for t in tools if not is_custom(t)]
    return (
        _best(functions, synonyms, keep=lambda t: _has_prop(t, PATH_NAMES) and not _is_patch_tool(t))
        or _best(functions, _EDIT_TOOLS, keep=lambda t: _creates(t) and _has_prop(t, PATH_NAMES))
        or next((t for t in tools if _is_patch_tool(t)), None)
        or _best(tools, SHELL_TOOLS, keep=_shell)
        or _best(functions, _EDIT_TOOLS, keep=lambda t: _has_prop(t, PATH_NAMES))
    )


def pick_tool(tools: list[dict[str, Any]], intent: Intent, required: bool) -> dict[str, Any] | None:
    """The best-fitting tool for the intent; with `required`, the first tool when none fits."""
    tools = [t for t in tools if isinstance(t, dict) and tool_name(t)]
    if not tools:
        return None
    usable = [t for t in tools if not _off_topic(t, intent.prompt)]
    if intent.kind == "write":
        tool = _pick_writer(usable)
        if tool is not None:
            return tool
    elif intent.kind is not None:
        synonyms = next(s for name, _, s in _INTENTS if name == intent.kind)
        fallback = _FALLBACK_TOOLS.get(intent.kind, ())
        actions = _ACTION_VALUES.get(intent.kind, ())
        tool = (
            _best(usable, synonyms)
            or next((t for t in usable if _acts(t, actions) and _has_prop(t, PATH_NAMES)), None)
            or (_best(usable, fallback, keep=_shell) if fallback else None)
        )
        if tool is not None:
            return tool
    return tools[0] if required else None


def tool_call_arguments(tool: dict[str, Any], intent: Intent) -> str:
    """The call's arguments as sent: JSON for a function tool, the raw text for a custom tool."""
    if is_custom(tool):
        return intent.patch if _is_patch_tool(tool) else intent.command if _shell(tool) else intent.content
    args = build_arguments(tool_schema(tool), intent)
    if _is_patch_tool(tool):
        props = _props(tool)
        key = next((k for k in props if _norm(k) in PATCH_NAMES), None)
        key = key or next((k for k in props if _type(_pick_schema(props[k])) == "string"), None)
        if key is not None:
            args[key] = intent.patch
    return json.dumps(args, ensure_ascii=False)


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
    kind = _type(schema)
    key = _norm(name)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return _enum_value(key, schema["enum"], intent)
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
        items = _pick_schema(schema.get("items", {}))
        if key in COMMAND_NAMES and _type(items) == "string" and "enum" not in items:
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
    if key in _ACTION_KEYS and intent.kind in _ACTION_VALUES:
        for wanted in _ACTION_VALUES[intent.kind]:
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
