"""Valid tool-call turns for the defect generator: every corpus case's `expected` calls, calls the mock
builds from a tool's schema (toolargs.build_arguments), and a seeded generator of arguments that
exercise escapes (Windows and UNC paths in path properties, code with newlines, regexes and quotes in
content properties) and typed values (integers, booleans, arrays of objects)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tapfix.proxy.mock.mutations_wire import Call, Turn, tool_name, tool_schema
from tapfix.proxy.mock.toolargs import analyze, build_arguments


def _tool(name: str, properties: dict[str, Any], required: list[str], description: str = "") -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


_S: dict[str, Any] = {"type": "string"}
AGENT_TOOLS: list[dict[str, Any]] = [
    _tool("write", {"path": _S, "content": _S}, ["path", "content"], "Write a file"),
    _tool("bash", {"command": _S, "timeout": {"type": "integer"}}, ["command"], "Run a shell command"),
    _tool(
        "edit",
        {"path": _S, "old": _S, "new": _S, "replace_all": {"type": "boolean"}},
        ["path", "old", "new"],
        "Replace text in a file",
    ),
    _tool(
        "todo",
        {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "content": _S,
                        "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                        "priority": {"type": "integer"},
                    },
                    "required": ["content", "status"],
                },
            }
        },
        ["items"],
        "Write the todo list",
    ),
    _tool(
        "read_file",
        {"file_path": _S, "offset": {"type": "integer"}, "limit": {"type": ["integer", "null"]}},
        ["file_path"],
        "Read a file",
    ),
    _tool(
        "grep",
        {
            "pattern": _S,
            "path": _S,
            "case_insensitive": {"type": "boolean"},
            "max_results": {"type": "number"},
            "options": {"type": "object", "properties": {"context": {"type": "integer"}, "glob": _S}},
        },
        ["pattern"],
        "Search files",
    ),
]

WINDOWS_PATHS = (
    "C:\\Users\\x\\new\\table.txt",
    "C:\\temp\\new\\reports",
    "C:\\bin\\app.exe",
    "D:\\build\\test\\run.log",
    "\\\\server\\share\\notes\\today.md",
    "C:\\Users\\runner\\AppData\\Local\\Temp\\build.bat",
    "E:\\repo\\src\\tools\\format.py",
)
POSIX_PATHS = ("src/app.py", "README.md", "/home/me/projects/cool/src/store.js", "docs/notes/äöü.md", ".")
CONTENTS = (
    'import re\n\nPATTERN = re.compile(r"\\d+\\s*(px|em)")\n\n\ndef main():\n\tprint("ok")\n',
    '#!/bin/sh\nset -e\necho "hello" > out.txt\n',
    'He said "yes" and left.\nThen: "no".',
    "line one\r\nline two\twith tab\n",
    'const s = "a\\\\b";\nconsole.log(s.replace(/\\\\/g, "/"));\n',
    '# Title\n\nSome *markdown* with `code` and a quote: "x".\n',
    '{"nested": "json text", "n": 1}',
    "plain text",
)
COMMANDS = (
    'grep -n "TODO" src/*.py',
    "ls -la",
    "python -c 'print(1)'",
    'echo "a\\tb" | tr "\\t" ","',
    "dir C:\\Users\\x /s",
)


def corpus_turns(directory: Path) -> list[Turn]:
    """One turn per corpus case: its offered tools and its `expected` calls."""
    turns = []
    for path in sorted(directory.glob("*.json")):
        case = json.loads(path.read_text(encoding="utf-8"))
        calls = [
            Call(f"call_{path.stem[:8]}{k:02d}", c["name"], c["arguments"])
            for k, c in enumerate(case.get("expected") or [])
            if isinstance(c.get("arguments"), dict)
        ]
        if calls and case.get("tools"):
            turns.append(Turn(case["tools"], calls, source=f"corpus:{path.stem}"))
    return turns


def _id(rng: random.Random) -> str:
    return "chatcmpl-tool-" + "".join(rng.choice("0123456789abcdef") for _ in range(24))


_PROMPTS = (
    "Create `src/app.py` that prints hello",
    "Run `ls -la` in the repo",
    "Read `README.md`",
    "Search for TODO in the code",
    "Edit `config.yaml`: set debug to true",
)


def mock_turn(rng: random.Random, tools: list[dict[str, Any]]) -> Turn:
    """1-3 calls whose arguments the mock builds from the tools' schemas."""
    calls = []
    for _ in range(rng.randint(1, 3)):
        tool = rng.choice(tools)
        args = build_arguments(tool_schema(tool), analyze(rng.choice(_PROMPTS)))
        calls.append(Call(_id(rng), tool_name(tool), args))
    return Turn(tools, calls, source="mock")


def _string_for(key: str, rng: random.Random) -> str:
    low = key.lower()
    if "path" in low or low in ("file", "dir"):
        return rng.choice(WINDOWS_PATHS if rng.random() < 0.6 else POSIX_PATHS)
    if low == "command":
        return rng.choice(COMMANDS)
    if low in ("content", "old", "new"):
        return rng.choice(CONTENTS)
    if low == "pattern":
        return rng.choice(("\\bTODO\\b", "def \\w+\\(", '"quoted"', "a|b"))
    return rng.choice(("example", 'say "hi" to them', "x\ny", "ok"))


def _value(key: str, schema: dict[str, Any], rng: random.Random, depth: int) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if isinstance(schema.get("enum"), list):
        return rng.choice(schema["enum"])
    if kind == "object":
        props = schema.get("properties") or {}
        required = schema.get("required") or []
        return {
            k: _value(k, sub, rng, depth + 1)
            for k, sub in props.items()
            if k in required or (depth < 3 and rng.random() < 0.7)
        }
    if kind == "array":
        items = schema.get("items") or {"type": "string"}
        return [_value(key, items, rng, depth + 1) for _ in range(rng.randint(1, 3))]
    if kind == "integer":
        return rng.choice((0, 1, 42, -7, 120000))
    if kind == "number":
        return rng.choice((0.5, 3, 1e-3, 2.25))
    if kind == "boolean":
        return rng.random() < 0.5
    return _string_for(key, rng)


def generated_turn(rng: random.Random, tools: list[dict[str, Any]] | None = None) -> Turn:
    """1-3 calls to agent-like tools with arguments that exercise escapes and typed values."""
    offered = tools or AGENT_TOOLS
    calls = []
    for _ in range(rng.randint(1, 3)):
        tool = rng.choice(offered)
        calls.append(Call(_id(rng), tool_name(tool), _value("", tool_schema(tool), rng, 0)))
    content = rng.choice(("", "", "I'll do that now.", "Let me check: "))
    return Turn(offered, calls, content=content, source="generated")


class TurnSource:
    """Draws turns from the corpus, the mock and the generator, all from one random.Random."""

    def __init__(self, corpus: list[Turn]) -> None:
        self.corpus = corpus
        self.corpus_tools = [t.tools for t in corpus]

    def draw(self, rng: random.Random) -> Turn:
        pick = rng.random()
        if self.corpus and pick < 0.3:
            turn = rng.choice(self.corpus)
            content = rng.choice(("", "Calling the tool."))
            return Turn(turn.tools, turn.calls, content, turn.source)
        if pick < 0.5:
            tools = rng.choice(self.corpus_tools) if self.corpus_tools and rng.random() < 0.5 else AGENT_TOOLS
            return mock_turn(rng, tools)
        return generated_turn(rng)
