"""Answers in a text edit format, for clients that edit files from the reply's text instead of tools.

aider offers no tools: its system prompt teaches the model a format and aider applies what the reply
writes in it. The mock reads which format the instructions teach, and the fence they use, from the
instructions themselves (their own example), then writes the file the prompt asks for in that format:

- a *file listing* (aider's `whole`): the path on a line, then the whole content in a fence;
- *SEARCH/REPLACE blocks* (`diff`; `diff-fenced` when the example has the path inside the fence): an
  empty SEARCH creates the file, an edit replaces `Hello`;
- a unified diff (`udiff`): `--- /dev/null` to `+++ path` for a new file;
- a V4A patch (`*** Begin Patch`, aider's `patch` and Codex's format).

Instructions that teach none of these get no edit answer (the caller answers in prose).
"""

from __future__ import annotations

import re

from tapfix.proxy.mock.prompt_intent import Intent

_FENCE = re.compile(r"^(`{3,}|<(source|code|pre|codeblock|sourcecode)>)[\w+-]*[ \t]*$", re.M)
_PATH_INSIDE_FENCE = re.compile(r"^(?:`{3,}|<\w+>)[\w+-]*\n[^\n`<]+\.\w+\n<{7} SEARCH", re.M)


def edit_answer(instructions: str, intent: Intent) -> str | None:
    """The reply that makes the prompt's file change in the format `instructions` teach, or None."""
    if intent.kind not in ("write", "edit") or not intent.filename:
        return None
    name, content = intent.filename, intent.content
    lines = content if content.endswith("\n") else content + "\n"
    old = "Hello\n" if intent.kind == "edit" else ""
    if "<<<<<<< SEARCH" in instructions and ">>>>>>> REPLACE" in instructions:
        opening, closing = _fence(instructions)
        block = f"<<<<<<< SEARCH\n{old}=======\n{lines}>>>>>>> REPLACE\n"
        if _PATH_INSIDE_FENCE.search(instructions):
            return f"{opening}\n{name}\n{block}{closing}\n"
        return f"{name}\n{opening}\n{block}{closing}\n"
    if "*** Begin Patch" in instructions:
        return intent.patch + "\n"
    if re.search(r"file listing", instructions, re.I):
        opening, closing = _fence(instructions)
        return f"{name}\n{opening}\n{lines}{closing}\n"
    if re.search(r"^--- ", instructions, re.M) and re.search(r"^\+\+\+ ", instructions, re.M) and "@@" in instructions:
        removed = "".join(f"-{line}\n" for line in old.splitlines())
        added = "".join(f"+{line}\n" for line in lines.splitlines())
        source = name if old else "/dev/null"
        return f"```diff\n--- {source}\n+++ {name}\n@@ ... @@\n{removed}{added}```\n"
    return None


def _fence(instructions: str) -> tuple[str, str]:
    """The fence the instructions' own example uses (aider picks one the files don't contain)."""
    m = _FENCE.search(instructions)
    if m is None:
        return "```", "```"
    if m.group(2):
        return f"<{m.group(2)}>", f"</{m.group(2)}>"
    return m.group(1), m.group(1)
