"""What a prompt asks the mock to do, read with a few regular expressions (no model).

The intent (write, edit, read, run, list, search, fetch), the file it names, the content to write,
the command to run, the pattern to search and the apply_patch text are all read from the prompt here;
which tool answers it and how its arguments are filled is `toolargs.py`'s and `schema_args.py`'s, so
the prompt side stays free of any tool schema.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass

# (intent, pattern in the prompt, tool-name synonyms) in priority order.
INTENTS: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
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

_URL = re.compile(r"https?://[^\s\"'`<>)]+")
_FILE = re.compile(r"(?<![\w/.-])((?:/?[\w.-]+/)*[A-Za-z_][\w-]*\.[A-Za-z0-9]{1,10})(?![\w/])")
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
    workdir: str | None = None  # where the client works (reading.working_directory), for absolute paths
    absolute_paths: bool = False  # the tool being filled asks for absolute paths (toolargs sets it)


def analyze(prompt: str, workdir: str | None = None) -> Intent:
    """What the user asks for, read with a few regular expressions; `workdir` is where the client works."""
    low = prompt.lower()
    kind = next((name for name, pattern, _ in INTENTS if pattern.search(low)), None)
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
        workdir=workdir,
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
