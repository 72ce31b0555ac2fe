"""What the writer's helpers (sessions, choices, bodies) send their SQL to: any connection-like object
taking qmark (`?`) parameters inside the writer's transaction. SQLite's connection is one as it is;
the PostgreSQL backend (store/pg/writer.py) is one by translating the marks. A module of its own so
the helpers and the backends (store/backend.py) both depend on it, not on each other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Rows(Protocol):
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Executes(Protocol):
    """qmark SQL inside the writer's transaction."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows: ...
    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...
