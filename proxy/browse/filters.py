"""The list page's filters, as typed in the form, shared by both backends; `Filters.where` is their
SQL for SQLite (PostgreSQL's is pg_filters.py `where`)."""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal
from urllib.parse import urlencode

import orjson

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
    """The list page's filters, as typed in the form (strings), with their SQL."""

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

    def where(self, now: float | None = None) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("model", self.model), ("path", self.path), ("session_id", self.session)):
            if value:
                where.append(f"e.{column} = ?")
                args.append(value)
        if self.client:  # a prefix: "opencode" matches "opencode/0.4.1 ai-sdk/..."; served by the index
            where.append("e.user_agent >= ? and e.user_agent < ?")
            args += [self.client, self.client + "\U0010ffff"]
        if self.status:
            where.append(self._status_sql(args))
        for column, value in (("flags", self.flag), ("tags", self.tag)):
            if value:  # values are identifiers: their quoted JSON form can only match an element
                where.append(f"e.{column} != '[]' and instr(e.{column}, ?) > 0")
                args.append(orjson.dumps(value).decode())
        if self.changes:
            where.append("e.changes_count > 0")
        if self.repairs:
            where.append(
                "e.changes_count > 0 and exists (select 1 from changes c"
                " where c.exchange_id = e.id and c.stage = 'toolcalls')"
            )
        for value, op in ((self.since, ">="), (self.until, "<")):
            if value:
                where.append(f"e.ts {op} ?")
                args.append(parse_time(value, now))
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

    def _status_sql(self, args: list[Any]) -> str:
        kind, values = self.status_test()
        args += values
        return {"error": ERRORS, "class": "e.status >= ? and e.status < ?", "code": "e.status = ?"}[kind]
