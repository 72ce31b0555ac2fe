"""Matching a streamed tool name to the offered tools: which broken names still say one tool.

A name that isn't offered is repaired only when it is a form of exactly one offered name: repeated
(`get_weatherget_weather`, a name appended once per resent delta), in another case or separator style
(`Get-Weather`), or behind a namespace prefix (`functions.get_weather`). When two offered tools
would match, or none, the name is not guessed: it passes through, flagged `unknown_tool`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tapfix.proxy.toolcalls.defects import DUPLICATED, UNKNOWN_TOOL, WRONG_NAME

_SEPARATORS = re.compile(r"[\s_\-.:/]+")
_PREFIX = re.compile(r"^(?:functions?|tools?|default_api)[.:/]", re.I)


@dataclass(frozen=True, slots=True)
class NameVerdict:
    name: str  # what the client gets
    kind: str | None  # None: the name is offered as sent


def fold_name(name: str) -> str:
    """A name without case, separators and a namespace prefix: what two spellings of one tool share."""
    return _SEPARATORS.sub("", _PREFIX.sub("", name)).casefold()


def _repeated(name: str, tool: str) -> bool:
    n, k = len(name), len(tool)
    return n > k and n % k == 0 and name == tool * (n // k)


def match_name(name: str, offered: list[str]) -> NameVerdict:
    """The offered tool a streamed name stands for, and the defect kind that explains the difference."""
    if name in offered or not offered:
        return NameVerdict(name, None)
    repeated = [t for t in offered if _repeated(name, t)]
    if len(repeated) == 1:
        return NameVerdict(repeated[0], DUPLICATED)
    candidates = {name, _PREFIX.sub("", name)}
    folded = {fold_name(c) for c in candidates}
    same = [t for t in offered if fold_name(t) in folded]
    if len(same) == 1:
        return NameVerdict(same[0], WRONG_NAME)
    whole = fold_name(name)
    repeated = [t for t in offered if fold_name(t) and _repeated(whole, fold_name(t))]
    if len(repeated) == 1:
        return NameVerdict(repeated[0], DUPLICATED)
    return NameVerdict(name, UNKNOWN_TOOL)
