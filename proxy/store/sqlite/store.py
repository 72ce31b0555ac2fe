"""A SQLite file as a capture store: SQLite's `StoreBackend` (store/backend.py), over this folder's parts.

Opening through it turns what the operating system says about an unusable path (a read-only file
system, a missing parent under /proc, a file where a folder should be) into a `StoreError` with one
line to show (store/sqlite/database.py `unusable`), so no command prints a traceback for a bad `--db`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.sqlite.database import unusable

if TYPE_CHECKING:
    from tapfix.proxy.store.backend import Since, StoreBackend
    from tapfix.proxy.store.check import StoreCheck
    from tapfix.proxy.store.copy import CopySource, CopyTarget
    from tapfix.proxy.store.parts import BrowseQueries, Follower
    from tapfix.proxy.store.reader import CaptureFilter, CaptureReader
    from tapfix.proxy.store.retention import PurgeReport
    from tapfix.proxy.store.writer import CaptureWriter


class SqliteStore:
    """A store in one SQLite file (WAL mode: one writer, readers beside it). Cheap to make: nothing is
    opened until a part is asked for."""

    name = "sqlite"
    errors: tuple[type[Exception], ...] = (sqlite3.Error, OSError)

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.location = str(self.path)

    def _open(self, *, write: bool = False) -> sqlite3.Connection:
        """Read-only (never creates or migrates), or to write (creates with mode 0600, migrates)."""
        from tapfix.proxy.store.sqlite.database import open_for_reading, open_for_writing

        try:
            return open_for_writing(self.path) if write else open_for_reading(self.path)
        except (OSError, sqlite3.Error) as e:
            raise unusable(self.path, e, "write to" if write else "read") from e

    def writer(self, *, wait: bool = True, **options: Any) -> CaptureWriter:
        """A file is never waited for: `wait` changes nothing here."""
        from tapfix.proxy.store.sqlite.writer import SqliteBackend
        from tapfix.proxy.store.writer import CaptureWriter

        try:
            return CaptureWriter(SqliteBackend(self.path), **options)
        except (OSError, sqlite3.Error) as e:
            raise unusable(self.path, e, "write to") from e

    def reader(self) -> CaptureReader:
        from tapfix.proxy.store.sqlite.reader import SqliteReader

        return SqliteReader(self._open())

    def tail(self, since: Since, filters: CaptureFilter) -> Follower:
        """The file is waited for, as `tail -F` waits: made later, it is followed from its start."""
        from tapfix.proxy.store.sqlite.tail import Following

        return Following(self.path, since, filters)

    def purge(
        self, max_age_s: float | None, max_bytes: int | None, *, vacuum: bool = False, dry_run: bool = False
    ) -> PurgeReport:
        """In small transactions, safe beside a running writer (SQLite's write lock serializes them);
        a dry run counts on a snapshot copy and neither migrates nor locks the store. The browser's
        search index drops the purged rows too (`index_rows`)."""
        from tapfix.proxy.store.retention import PurgeReport, check_max_size
        from tapfix.proxy.store.sqlite import retention
        from tapfix.proxy.store.sqlite.search_index import purge_sidecar

        if not self.path.exists():
            raise StoreError(f"no capture database at {self.path} (pass --db)")
        conn = self._open(write=not dry_run)
        try:
            check_max_size(max_bytes, retention.store_floor(conn))
            if dry_run:
                report = retention.dry_run(conn, max_age_s, max_bytes)
            elif max_age_s is not None or max_bytes is not None:
                report = retention.purge(conn, max_age_s, max_bytes)
            else:
                report = PurgeReport()
            if vacuum and not dry_run:
                retention.vacuum(conn)
                report.bytes_after = retention.file_bytes(conn)
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: purge failed, nothing lost ({e})") from e
        finally:
            conn.close()
        report.index_rows = 0 if dry_run else purge_sidecar(self.path)
        return report

    def schema_version(self) -> str | None:
        from tapfix.proxy.store.sqlite.copy import file_version

        return file_version(self.path)

    def copy_source(self) -> CopySource:
        from tapfix.proxy.store.sqlite.copy import SqliteSource

        return SqliteSource(self.path)

    def copy_target(self) -> CopyTarget:
        from tapfix.proxy.store.sqlite.copy import SqliteTarget

        return SqliteTarget(self.path)

    def browse(self, *, search: bool = True, index_path: Path | None = None, background: bool = True) -> BrowseQueries:
        """Read-only connections, and (`search`) the full-text index in a sidecar file the browser keeps
        (`index_path`, default `<db>.fts.sqlite`; `background`: kept up by a thread while serving)."""
        from tapfix.proxy.store.sqlite.browse import SqliteBrowse
        from tapfix.proxy.store.sqlite.search_index import SearchIndex

        self._open().close()  # a missing or foreign store first: no index file made beside it
        try:
            index = SearchIndex(self.path, index_path) if search else None
        except (OSError, sqlite3.Error) as e:
            raise StoreError(
                f"can't keep the search index ({e}): pass --index PATH somewhere writable, or --no-search"
            ) from e
        return SqliteBrowse(self.path, index, background=background)

    def check(self, timeout: float) -> StoreCheck:
        from tapfix.proxy.store.check import StoreCheck
        from tapfix.proxy.store.sqlite.database import known_migrations, read_only_uri
        from tapfix.proxy.store.sqlite.schema import migrations

        report = StoreCheck(str(self.path), known=[m for m in _migration_order() if m in known_migrations()])
        if not self.path.exists():
            report.reached = "no file yet (the first `tapfix run` on it creates it)"
            return report
        try:
            conn = sqlite3.connect(read_only_uri(self.path), uri=True)
            try:
                tables = {str(r[0]) for r in conn.execute("select name from sqlite_master where type = 'table'")}
                if "_sqlite_migrations" in tables:
                    report.applied = [
                        str(r[0])
                        for r in conn.execute(
                            "select name from _sqlite_migrations where migration_set = ? order by rowid",
                            (migrations.name,),
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

    def same_store(self, other: StoreBackend) -> bool:
        return isinstance(other, SqliteStore) and self.path.resolve() == other.path.resolve()

    def scrub(self, text: str) -> str:
        return text  # a path holds no password

    def as_argument(self) -> str:
        return str(self.path.resolve())


def _migration_order() -> list[str]:
    from tapfix.proxy.store.sqlite.database import tapfix_migrations

    migrations = tapfix_migrations()  # first: it imports sqlite-utils without numpy
    from sqlite_utils import Database

    return [m.name for m in migrations.pending(Database(memory=True))]
