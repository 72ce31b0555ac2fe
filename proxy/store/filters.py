"""The browser's list and stats filters, as typed in the form: what the store's queries select by.
Each backend's SQL for them is its own (store/sqlite/filters.py, store/pg/filters.py)."""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal
from urllib.parse import urlencode

# An exchange that failed: no status, an HTTP error, or an error the engine sent in a 200 (PostgreSQL's
# partial index exchanges_errors, pg005, has this predicate)
ERRORS = "(e.status is null or e.status >= 400 or e.error is not null)"
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class FilterError(ValueError):
    """A filter value the user typed that can't be understood; shown on the page, never a 500."""


def parse_time(value: str, now: float | None = None) -> float:
    """`15m`, `2h`, `7d` (ago) or an ISO date/datetime (UTC unless it says otherwise) → unix time."""
    value = value.strip()
    match = _RELATIVE.match(value)
    if match:
        return (now or time.time()) - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise FilterError(f"time {value!r}: use 15m, 2h, 7d or 2025-01-31T10:00") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


@dataclass
class Filters:
    """The list page's filters, as typed in the form (strings)."""

    q: str = ""
    model: str = ""
    client: str = ""
    path: str = ""
    status: str = ""
    flag: str = ""
    tag: str = ""
    session: str = ""
    since: str = ""
    until: str = ""
    changes: str = ""
    repairs: str = ""

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Filters:
        return cls(**{f.name: str(params.get(f.name, "")).strip()[:500] for f in fields(cls)})

    def query(self, **override: str) -> str:
        values = {f.name: getattr(self, f.name) for f in fields(self)} | override
        return urlencode({k: v for k, v in values.items() if v})

    def active(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def alike(self) -> tuple[list[str], list[Any]]:
        """The conditions every backend spells alike (qmark SQL on `exchanges e`), with their arguments: a
        column equal to a value, and the status. Each backend adds its own for the rest
        (store/sqlite/filters.py, store/pg/filters.py)."""
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("model", self.model), ("path", self.path), ("session_id", self.session)):
            if value:
                where.append(f"e.{column} = ?")
                args.append(value)
        if self.status:
            kind, values = self.status_test()
            where.append({"error": ERRORS, "class": "e.status >= ? and e.status < ?", "code": "e.status = ?"}[kind])
            args += values
        return where, args

    def status_test(self) -> tuple[Literal["error", "class", "code"], list[int]]:
        """What `status=` asks for, checked once for both backends: 'error', a class (its bounds) or a code."""
        status = self.status.lower()
        if status == "error":
            return "error", []
        if re.fullmatch(r"[1-5]xx", status):
            return "class", [int(status[0]) * 100, int(status[0]) * 100 + 100]
        if status.isdigit():
            return "code", [int(status)]
        raise FilterError(f"status {self.status!r}: use a code (200), a class (4xx) or 'error'")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def search_terms(query: str) -> list[tuple[str, bool]]:
    """User words → (text, is a prefix) for every word or "quoted phrase"; `word*` is a prefix.

    Control characters separate words like a space: FTS5 rejects a NUL even inside a quoted term,
    and the tokenizer never indexes control characters anyway. Both backends search by these terms
    (store/sqlite/search_index.py `to_match`, store/pg/browse.py `search_where`)."""
    terms = []
    for phrase, word in re.findall(r'"([^"]*)"|(\S+)', _CONTROL.sub(" ", query)):
        text = (phrase or word).replace('"', "")
        prefix = bool(word) and text.endswith("*")
        text = text.rstrip("*")
        if text.strip():
            terms.append((text, prefix))
    return terms
