"""A PostgreSQL database as a capture store: PostgreSQL's `StoreBackend` (store/backend.py), over this
folder's parts. Loaded for a `postgresql://` store alone, whose locator has made sure psycopg (the
extra `tapfix[postgres]`) is there.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.pg.locator import PostgresLocator

if TYPE_CHECKING:
    from tapfix.proxy.store.backend import Since, StoreBackend
    from tapfix.proxy.store.check import StoreCheck
    from tapfix.proxy.store.copy import CopySource, CopyTarget
    from tapfix.proxy.store.parts import BrowseQueries, Follower
    from tapfix.proxy.store.reader import CaptureFilter, CaptureReader
    from tapfix.proxy.store.retention import PurgeReport
    from tapfix.proxy.store.writer import CaptureWriter


class PostgresStore:
    """A store in one PostgreSQL database (or a schema of it, named by the URL); any number of tapfix
    instances write it at once. Cheap to make: nothing connects until a part is asked for."""

    name = "postgresql"
    errors: tuple[type[Exception], ...] = (psycopg.Error, OSError)

    def __init__(self, locator: PostgresLocator) -> None:
        self.locator = locator
        self.location = str(locator)

    def writer(self, *, wait: bool = True, **options: Any) -> CaptureWriter:
        """Migrated, today's and tomorrow's days made; with `wait`, once the server can be reached."""
        from tapfix.proxy.store.pg.writer import postgres_writer

        return postgres_writer(self.locator, wait=wait, **options)

    def reader(self) -> CaptureReader:
        from tapfix.proxy.store.pg.reader import PostgresReader

        return PostgresReader(self.locator)

    def tail(self, since: Since, filters: CaptureFilter) -> Follower:
        """A server has no file to wait for: the store is there, or the reader says why not."""
        from tapfix.proxy.store.pg.reader import PostgresReader
        from tapfix.proxy.store.pg.tail import PostgresTail, cursor

        reader = PostgresReader(self.locator)
        try:
            return PostgresTail(reader, cursor(reader, since), filters)
        except BaseException:
            reader.close()
            raise

    def purge(
        self, max_age_s: float | None, max_bytes: int | None, *, vacuum: bool = False, dry_run: bool = False
    ) -> PurgeReport:
        """store/pg/retention.py on a connection of its own (autocommit: each step a transaction)."""
        from tapfix.proxy.store.pg import retention
        from tapfix.proxy.store.pg.migrate import applied
        from tapfix.proxy.store.pg.reader import connect, said
        from tapfix.proxy.store.retention import PurgeReport

        if dry_run:
            raise StoreError(f"{self.location}: --dry-run is not built for PostgreSQL stores (only for SQLite files)")
        conn = connect(self.locator, "purge")
        try:
            if not applied(conn):
                raise StoreError(f"{self.location}: no tapfix store there yet (a tapfix run with this --db makes it)")
            report = None
            if max_age_s is not None or max_bytes is not None:
                report = retention.purge(conn, max_age_s, max_bytes)
            report = report or PurgeReport(bytes_before=retention.used_bytes(conn))
            if vacuum:
                retention.vacuum(conn)
                report.bytes_after = retention.used_bytes(conn)
        except psycopg.Error as e:
            raise StoreError(f"{self.location}: purge failed, nothing lost ({said(self.locator, e)})") from None
        finally:
            conn.close()
        return report

    def schema_version(self) -> str | None:
        from tapfix.proxy.store.pg.copy import database_version

        return database_version(self.locator)

    def copy_source(self) -> CopySource:
        from tapfix.proxy.store.pg.copy import PostgresSource

        return PostgresSource(self.locator)

    def copy_target(self) -> CopyTarget:
        from tapfix.proxy.store.pg.copy import PostgresTarget

        return PostgresTarget(self.locator)

    def browse(self, *, search: bool = True, index_path: Path | None = None, background: bool = True) -> BrowseQueries:
        """A small pool of read-only connections; search reads the columns the writer keeps (no index
        to make: `search`, `index_path` and `background` change nothing here)."""
        from tapfix.proxy.store.pg.browse import PostgresBrowse

        return PostgresBrowse(self.locator)

    def check(self, timeout: float) -> StoreCheck:
        from tapfix.proxy.store.check import StoreCheck
        from tapfix.proxy.store.pg.migrate import applied
        from tapfix.proxy.store.pg.schema import MIGRATIONS

        report = StoreCheck(self.location, known=[name for name, _ in MIGRATIONS])
        try:
            with psycopg.connect(
                self.locator.url,
                autocommit=True,
                connect_timeout=max(1, round(timeout)),
                application_name="tapfix check",
            ) as conn:
                version = conn.info.server_version
                report.applied = applied(conn)
        except psycopg.Error as e:
            report.problem = self.locator.scrub(" ".join(str(e).split()))
            return report
        report.reached = f"PostgreSQL {version // 10000}.{version % 10000}"
        return report

    def same_store(self, other: StoreBackend) -> bool:
        return isinstance(other, PostgresStore) and self.location == other.location

    def scrub(self, text: str) -> str:
        return self.locator.scrub(text)

    def as_argument(self) -> str:
        return self.location  # the password masked: a command line shown on a page holds none
