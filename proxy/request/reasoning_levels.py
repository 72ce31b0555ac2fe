"""Reasoning levels and what both request dialects share: the none..max scale, parsing a client's
value onto it, the per-model settings and the result the dialect rewriters fill.

Its own module so the Chat/Responses rewriter (`reasoning`) and the Messages one
(`reasoning_messages`) both build on it without importing each other.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from dataclasses import field as _field
from typing import TYPE_CHECKING, Any

from tapfix.proxy.changes import Change
from tapfix.proxy.config.model import LEVELS
from tapfix.proxy.jsonsplice import Edit, Path, json_path

if TYPE_CHECKING:
    from tapfix.proxy.errors import LocalAnswer

# Thinking budgets in tokens → level: <=0 none, <=1024 minimal, <4096 low, <12288 medium, else high.
# Chosen so the budget tables clients publish map back to their own level (pi/omp: minimal 1024,
# low 2048, medium 8192, high 16384; omp's Anthropic high sends 12384).
BUDGET_THRESHOLDS = ((0, "none"), (1024, "minimal"), (4095, "low"), (12287, "medium"))
_OFF_WORDS = {"off", "disabled", "disable", "false", "no"}
_ON_WORDS = {"on", "enabled", "enable", "true", "yes", "auto", "adaptive"}
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


@dataclass(slots=True)
class ReasoningResult:
    edits: list[Edit] = _field(default_factory=list)
    changes: list[Change] = _field(default_factory=list)
    error: LocalAnswer | None = None  # answer the client with this instead of forwarding

    def add(self, kind: str, path: Path, before: Any, after: Any, reason: str, edit: Edit | None = None) -> None:
        self.changes.append(Change("reasoning", kind, json_path(path), before, after, reason))
        if edit is not None:
            self.edits.append(edit)


def level_from_number(value: Any) -> str | None:
    """0-100 integers (and floats without a fraction, as JS sends `1.0`); floats with a fraction on 0-1."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value.is_integer():
            value = int(value)
        elif 0 < value < 1:
            value = value * 100
        else:
            return None
    if value < 0 or value > 100:
        return None
    if value == 0:
        return "none"
    return "low" if value <= 33 else "medium" if value <= 66 else "high"


def level_from_budget(tokens: int) -> str:
    for bound, level in BUDGET_THRESHOLDS:
        if tokens <= bound:
            return level
    return "high"


def clamp_level(level: str, accepted: tuple[str, ...]) -> str:
    """The nearest accepted level on the none..max scale; a tie goes to the higher level."""
    if level in accepted or not accepted:
        return level
    index = LEVELS.index(level)
    return min(accepted, key=lambda a: (abs(LEVELS.index(a) - index), -LEVELS.index(a)))


def parse_level(value: Any) -> tuple[bool | None, str | None]:
    """(on, level) of an effort value: a level name, a number, a numeric string or a bool."""
    if isinstance(value, bool):
        return value, None if value else "none"
    if isinstance(value, str):
        word = value.strip().lower()
        if word in LEVELS:
            return word != "none", word
        if word in _OFF_WORDS:
            return False, "none"
        if word in _ON_WORDS:
            return True, None
        if _NUMBER.fullmatch(word):
            number = float(word)
            value = int(number) if number.is_integer() and "e" not in word else number
    level = level_from_number(value)
    if level is None:
        return None, None
    return level != "none", level
