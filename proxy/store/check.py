"""`tapfix check --db LOCATOR`: can the store be reached, and is its schema the one this tapfix writes?

Read-only on both backends: it never creates, migrates or locks anything, so it is safe to point at
a fleet's live database. The schema is told by migration names (each backend records its own):
- up to date: every migration this tapfix knows is applied;
- behind: some are not yet (an older tapfix made it, or nobody wrote yet): the next writer of this
  version applies them, readers read it as it is. No problem;
- ahead: a migration this tapfix doesn't know is applied (a newer tapfix migrated it): this one
  would refuse to write it. A problem, as an unreachable store or someone else's database is.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tapfix.proxy.store.locator import StoreLocator


@dataclass
class StoreCheck:
    location: str  # masked
    reached: str | None = None  # what answered (PostgreSQL 16.4, a SQLite file); None: unreachable
    problem: str | None = None  # why it can't be used, one line
    applied: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)  # this tapfix's migrations, in order

    @property
    def schema(self) -> str:
        unknown = [name for name in self.applied if name not in self.known]
        if unknown:
            return f"ahead: migration {', '.join(unknown)} is unknown to this tapfix (a newer tapfix migrated it)"
        count = f"{len(set(self.applied) & set(self.known))} of {len(self.known)} migrations"
        pending = [name for name in self.known if name not in self.applied]
        if pending:
            return f"behind ({count}): the next `tapfix run` on it applies {', '.join(pending)}"
        return f"up to date ({count})"

    @property
    def failed(self) -> bool:
        return self.problem is not None or self.schema.startswith("ahead")

    def render(self) -> str:
        mark = "FAIL" if self.failed else "ok  "
        if self.reached is None:
            return f"store    {mark} {self.location}  unreachable: {self.problem}"
        detail = f"{self.reached}; schema {self.schema}"
        return f"store    {mark} {self.location}  {detail}" + (f"; {self.problem}" if self.problem else "")


def check_store(locator: StoreLocator, timeout: float = 5.0) -> StoreCheck:
    if locator.postgres is not None:
        return _check_postgres(locator, timeout)
    return _check_sqlite(locator)


def _check_sqlite(locator: StoreLocator) -> StoreCheck:
    from tapfix.proxy.store.database import known_migrations, read_only_uri
    from tapfix.proxy.store.schema import migrations

    known = [m for m in _sqlite_order() if m in known_migrations()]
    report = StoreCheck(str(locator.path), known=known)
    if not locator.path.exists():
        report.reached = "no file yet (the first `tapfix run` on it creates it)"
        return report
    try:
        conn = sqlite3.connect(read_only_uri(locator.path), uri=True)
        try:
            tables = {str(r[0]) for r in conn.execute("select name from sqlite_master where type = 'table'")}
            if "_sqlite_migrations" in tables:
                report.applied = [
                    str(r[0])
                    for r in conn.execute(
                        "select name from _sqlite_migrations where migration_set = ? order by rowid", (migrations.name,)
                    )
                ]
        finally:
            conn.close()
    except (OSError, sqlite3.Error) as e:
        report.problem = f"can't read it ({e})"
        return report
    report.reached = "SQLite file"
    if not report.applied and tables - {"_sqlite_migrations"}:
        report.problem = "not a tapfix capture database (tables, and no record of tapfix's migrations)"
    return report


def _sqlite_order() -> list[str]:
    from tapfix.proxy.store.database import tapfix_migrations

    migrations = tapfix_migrations()  # first: it imports sqlite-utils without numpy
    from sqlite_utils import Database

    return [m.name for m in migrations.pending(Database(memory=True))]


def _check_postgres(locator: StoreLocator, timeout: float) -> StoreCheck:
    import psycopg
    from tapfix.proxy.store.pg.migrate import applied
    from tapfix.proxy.store.pg.schema import MIGRATIONS

    pg = locator.postgres
    assert pg is not None
    report = StoreCheck(str(pg), known=[name for name, _ in MIGRATIONS])
    try:
        with psycopg.connect(
            pg.url, autocommit=True, connect_timeout=max(1, round(timeout)), application_name="tapfix check"
        ) as conn:
            version = conn.info.server_version
            report.applied = applied(conn)
    except psycopg.Error as e:
        report.problem = pg.scrub(" ".join(str(e).split()))
        return report
    report.reached = f"PostgreSQL {version // 10000}.{version % 10000}"
    return report
