"""Why a prompt stopped extending the previous one: the cause of a prefix break (prefix_break.py), named
from where the first difference is and what is on either side of it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol


class Unit(Protocol):
    """A prompt part as prefix_break.py reads it (its `Unit`)."""

    @property
    def kind(self) -> str: ...
    @property
    def path(self) -> tuple[str | int, ...]: ...
    @property
    def value(self) -> Any: ...
    @property
    def digest(self) -> bytes: ...
    @property
    def volatile(self) -> bool: ...


class Prompt(Protocol):
    """A request's prompt part (prefix_break.py's `Prompt`)."""

    @property
    def units(self) -> Sequence[Unit]: ...
    @property
    def conversation(self) -> int: ...


CAUSES = (
    "billing_line",
    "timestamp",
    "system_edited",
    "tools_reordered",
    "tools_changed",
    "compaction",
    "message_rewritten",
    "template_settings",
    "prompt_cache_key",
)
_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?|\d{1,2}:\d{2}(?::\d{2})?|\d{1,2}/\d{1,2}/\d{2,4}"
    r"|\b1\d{9}(?:\.\d+)?\b|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\b"
    r"|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2}\b"
)


def cause_of(previous: Prompt, new: Prompt, old: Unit, now: Unit, a: Any, b: Any, char: int | None) -> tuple[str, str]:
    if old.volatile or now.volatile:
        return "billing_line", "Claude Code's billing line (x-anthropic-billing-header) changed"
    if char is not None and (_time_at(a, char) or _time_at(b, char)):
        where = "system prompt" if old.kind == "system" else old.kind
        return "timestamp", f"a timestamp or date in the {where} changed"
    if old.kind == "system":
        return "system_edited", "the system prompt was edited"
    if old.kind == "tool":
        return _tools_cause(previous, new)
    return _item_cause(previous, new, old)


def _item_cause(previous: Prompt, new: Prompt, old: Unit) -> tuple[str, str]:
    if new.conversation < previous.conversation:
        return (
            "compaction",
            f"the history shrank from {previous.conversation} to {new.conversation} items (compacted or summarised)",
        )
    where = old.path[-1] if isinstance(old.path[-1], int) else 0
    return "message_rewritten", f"an earlier message ({old.path[0]}[{where}]) was rewritten"


def missing_cause(previous: Prompt, new: Prompt, old: Unit) -> tuple[str, str]:
    if old.volatile:
        return "billing_line", "Claude Code's billing line was added or removed"
    if old.kind == "system":
        return "system_edited", "the system prompt was edited"
    if old.kind == "tool":
        return _tools_cause(previous, new)
    return _item_cause(previous, new, old)


def _tool_name(value: Any) -> str:
    if not isinstance(value, dict):
        return "?"
    function = value.get("function")
    name = function.get("name") if isinstance(function, dict) else value.get("name")
    return str(name) if name is not None else "?"


def _tools_cause(previous: Prompt, new: Prompt) -> tuple[str, str]:
    old = {_tool_name(u.value): u.digest for u in previous.units if u.kind == "tool"}
    now = {_tool_name(u.value): u.digest for u in new.units if u.kind == "tool"}
    if old == now:
        return "tools_reordered", "the same tools came in another order"
    added, removed = sorted(now.keys() - old.keys()), sorted(old.keys() - now.keys())
    edited = sorted(k for k in old.keys() & now.keys() if old[k] != now[k])
    said = [f"{what}: {', '.join(names[:5])}" for what, names in (("added", added), ("removed", removed)) if names]
    said += [f"changed: {', '.join(edited[:5])}"] if edited else []
    return "tools_changed", "the tools changed (" + "; ".join(said) + ")" if said else "the tools changed"


def _time_at(text: Any, char: int) -> bool:
    if not isinstance(text, str):
        return False
    window = max(0, char - 40)
    return any(m.start() <= char - window <= m.end() for m in _TIME.finditer(text[window : char + 40]))
