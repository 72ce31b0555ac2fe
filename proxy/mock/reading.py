"""How the scripted model reads a conversation: whose turn it is, what the user asked, where the work
happens, and what a tool answered.

Clients wrap the user's words in much else, and each differently: instructions (`system`/`developer`
messages) anywhere in the history (Claude Code sends one after the prompt), reminders inside the user's
own message, the working directory in a system prompt or an environment message, a tool's failure as a
flag (Anthropic's `is_error`) or only as words. A model reads past all that; so does the mock, by these
rules and not by knowing a particular client:

- the **turn** is decided by the last message that is not an instruction: a trailing system message
  never hides the prompt or the tool result before it;
- the **prompt** is the last user message with words of its own (`<system-reminder>` parts are not);
- the **working directory** is the first absolute path a text introduces as one ("working directory:",
  "working in the directory", `<cwd>…</cwd>`, "cwd:", "project root:"), system texts first;
- a **tool result failed** when the client flagged it, or when it opens like an error (its first line).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

INSTRUCTION_ROLES = frozenset({"system", "developer"})

_WORKDIR = re.compile(
    r"(?:working[ _-]?dir(?:ectory)?|working in the directory|current (?:working )?directory|\bcwd\b|"
    r"project (?:root|directory)|workspace (?:root|folder|directory))"
    r"[^\S\n]*(?:is|:|=)?[^\S\n]*[`'\"]?(/[^\s`'\"<>]*)",
    re.I,
)
_CWD_TAG = re.compile(r"<cwd>\s*(/[^<\s]*)\s*</cwd>")
# A result whose first line opens like one of these failed (what a model skims before reading on).
_FAILS_AT_START = re.compile(
    r"^\W*(?:error|errors|failed|failure|fatal|exception|traceback|denied|rejected|refused|invalid|cannot|"
    r"can't|could not|couldn't|unable|not found|no such|permission denied|aborted|cancell?ed|timed? ?out)\b",
    re.I,
)
# ... or that says one of these anywhere in it.
_FAILS_ANYWHERE = re.compile(
    r"\b(?:must be (?:an? )?(?:absolute|relative|valid|provided|given|set)|is required|are required|"
    r"missing (?:required )?(?:parameter|argument|field|file|property)|rejected|denied|refused|"
    r"(?:is|was) not allowed|does not exist|doesn't exist|no such file|permission denied|not permitted|"
    r"exit(?:ed)?(?: with)? (?:code|status):? ?[1-9]\d*|has not been read|tool_use_error)\b",
    re.I,
)


def turn_index(messages: list[dict[str, Any]]) -> int:
    """The index of the message that decides the turn: the last one that is not an instruction (the
    last message when all are instructions; -1 for none)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") not in INSTRUCTION_ROLES:
            return i
    return len(messages) - 1


def turn_role(roles: list[str | None]) -> str | None:
    """The role that decides the turn, from the roles in order (see `turn_index`)."""
    for role in reversed(roles):
        if role not in INSTRUCTION_ROLES:
            return role
    return roles[-1] if roles else None


def prompt_message(messages: list[dict[str, Any]], text_of: Any) -> dict[str, Any]:
    """The last user message with words of its own, else the last user message, else {}."""
    users = [m for m in messages if m.get("role") == "user"]
    return next((m for m in reversed(users) if text_of(m.get("content")).strip()), users[-1] if users else {})


def working_directory(texts: list[str]) -> str | None:
    """The first absolute path a text introduces as the working directory."""
    for text in texts:
        for pattern in (_CWD_TAG, _WORKDIR):
            m = pattern.search(text)
            if m:
                path = m.group(1).rstrip(".,;:)]}")
                if len(path) > 1:
                    return posixpath.normpath(path)
    return None


def wants_absolute(description: Any) -> bool:
    """A schema or tool description that asks for an absolute path (not one that takes either kind)."""
    if not isinstance(description, str) or not re.search(r"\babsolute\b", description, re.I):
        return False
    return not re.search(r"absolute or relative|relative or absolute|may be relative", description, re.I)


def absolute(path: str, workdir: str | None) -> str:
    """`path` under `workdir` (a relative path), else `path` as it is."""
    if workdir is None or path.startswith("/"):
        return path
    return posixpath.normpath(posixpath.join(workdir, path))


@dataclass
class ToolResult:
    """What one tool call answered, as the mock reads it."""

    text: str
    images: list[str] = field(default_factory=list)  # image URLs (data: URLs are decoded)
    flagged: bool = False  # the client said it failed (Anthropic's `is_error`)

    @property
    def failure(self) -> str | None:
        """The line that says the call failed, or None when it did not."""
        lines = [line.strip() for line in self.text.strip().splitlines() if line.strip()]
        first = _unwrap(lines[0]) if lines else ""
        if self.flagged:
            return first or "the tool reported an error"
        if first and _FAILS_AT_START.search(first):
            return first
        head = self.text[:500]
        m = _FAILS_ANYWHERE.search(head)
        if m:
            line = next((_unwrap(line) for line in lines if m.group(0) in line), first)
            return line or m.group(0)
        return None


def _unwrap(line: str) -> str:
    """`<tool_use_error>File does not exist.</tool_use_error>` -> `File does not exist.`"""
    return re.sub(r"</?[a-z_]+>", "", line).strip()[:200]
