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

The prompt is read by `prompt_intent.py` and the arguments are filled from the schema by
`schema_args.py`; this module picks the tool and sends its arguments as the tool takes them.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from tapfix.proxy.mock.jsonish import arr, obj
from tapfix.proxy.mock.prompt_intent import INTENTS, Intent

# `analyze` and `build_arguments` are re-exported (`as`): agent_script.py and mutations_turns.py import them from here.
from tapfix.proxy.mock.prompt_intent import analyze as analyze
from tapfix.proxy.mock.reading import wants_absolute
from tapfix.proxy.mock.schema_args import (
    ACTION_KEYS,
    ACTION_VALUES,
    COMMAND_NAMES,
    PATCH_NAMES,
    PATH_NAMES,
    pick_schema,
    prop_key,
    schema_type,
)
from tapfix.proxy.mock.schema_args import build_arguments as build_arguments

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
    return obj(pick_schema(tool_schema(tool)).get("properties"))


def _off_topic(tool: dict[str, Any], prompt: str) -> bool:
    """The tool is about a topic (stdin, plan, todo, image...) the prompt does not mention."""
    name = tool_name(tool).lower()
    required = [r for r in arr(pick_schema(tool_schema(tool)).get("required")) if isinstance(r, str)]
    words = set().union(*(_words(r) for r in required)) if required else set()
    for topic in _TOPICS:
        if (topic in name or topic in words) and not re.search(rf"\b{topic}", prompt):
            return True
    return False


def _has_prop(tool: dict[str, Any], names: set[str]) -> bool:
    return any(prop_key(prop) in names for prop in _props(tool))


def _is_patch_tool(tool: dict[str, Any]) -> bool:
    if _score(tool_name(tool), _PATCH_TOOLS) >= 200:
        return True
    grammar = obj(tool.get("format")).get("definition")
    text = tool_description(tool) + (grammar if isinstance(grammar, str) else "")
    return "*** Begin Patch" in text or "*** Add File" in text


def _acts(tool: dict[str, Any], wanted: tuple[str, ...]) -> bool:
    """The tool has an action-like enum (`command: view|create|str_replace`) with one of `wanted`."""
    for prop, sub in _props(tool).items():
        values = pick_schema(sub).get("enum")
        if prop_key(prop) in ACTION_KEYS and isinstance(values, list) and any(w in values for w in wanted):
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
    synonyms = next(s for name, _, s in INTENTS if name == "write")
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
        synonyms = next(s for name, _, s in INTENTS if name == intent.kind)
        fallback = _FALLBACK_TOOLS.get(intent.kind, ())
        actions = ACTION_VALUES.get(intent.kind, ())
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
    args = build_arguments(tool_schema(tool), replace(intent, absolute_paths=wants_absolute(tool_description(tool))))
    if _is_patch_tool(tool):
        props = _props(tool)
        key = next((k for k in props if prop_key(k) in PATCH_NAMES), None)
        key = key or next((k for k in props if schema_type(pick_schema(props[k])) == "string"), None)
        if key is not None:
            args[key] = intent.patch
    return json.dumps(args, ensure_ascii=False)
