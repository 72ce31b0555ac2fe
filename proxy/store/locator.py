"""Where the capture store lives: what `--db` (or `$TAPFIX_DB`, or the default) names.

Commands receive a `StoreLocator`, never a bare path, and open the store through it, so a second
backend (a server instead of a SQLite file) plugs in here: a new kind of locator, parsed from the
same `--db` value, and the commands stay as they are. A `postgresql://` or `postgres://` URL is a
PostgreSQL locator (store/pg/locator.py: parsing, and the password masked wherever it is shown); any
other value that looks like a URL is refused, naming its scheme (store/locator_url.py). A
command whose PostgreSQL side is built passes `postgres=True`; every other one is refused in one place
(`_postgres_store`), naming what it lacks, until its side is built.

Opening through the locator also turns what the operating system says about an unusable path (a
read-only file system, a missing parent under /proc, a file where a folder should be) into a
`StoreError` with one line to show, so no command prints a traceback for a bad `--db`.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from tapfix.proxy.store.database import open_when_ready
from tapfix.proxy.store.locator_url import NotAStoreLocator, refuse_url_like
from tapfix.proxy.store.pg.locator import PostgresLocator, is_postgres_url
from tapfix.proxy.store.reader import SqliteReader
from tapfix.proxy.store.writer import StoreError, open_for_reading, open_for_writing

if TYPE_CHECKING:
    from tapfix.proxy.store.reader import CaptureReader
    from tapfix.proxy.store.writer import CaptureWriter

DEFAULT_DB = "captures/tapfix.db"
ENV = "TAPFIX_DB"


def _unusable(path: Path, e: Exception, doing: str) -> StoreError:
    return StoreError(f"{path}: can't {doing} the capture database ({_reason(path, e)})")


def _reason(path: Path, e: Exception) -> str:
    if path.is_dir():
        return "that is a folder; name a file in it"
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            return f"{parent} is a file, not a folder"
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def _postgres_store(locator: PostgresLocator) -> NoReturn:
    """The one place that refuses a PostgreSQL store: a command without `postgres=True` (`demo`)."""
    raise StoreError(
        f"{locator}: this command can't use a PostgreSQL store (`demo` keeps a SQLite file of its own; every"
        " other command takes a PostgreSQL --db); pass --db with a SQLite file"
    )


@dataclass(frozen=True)
class StoreLocator:
    path: Path
    postgres: PostgresLocator | None = None  # a PostgreSQL store (then `path` is unused)

    @classmethod
    def resolve(cls, value: str | os.PathLike[str] | None = None, *, postgres: bool = False) -> StoreLocator:
        """`--db VALUE`, else `$TAPFIX_DB`, else `captures/tapfix.db`. A PostgreSQL URL is taken only by
        the commands whose PostgreSQL side is built (`postgres`); others refuse it (`StoreError`, the
        password masked)."""
        text = os.fspath(value) if value else os.environ.get(ENV) or DEFAULT_DB
        try:
            refuse_url_like(text)  # a typo (`postgressql://…`) never becomes a SQLite file
        except NotAStoreLocator as e:
            raise NotAStoreLocator(f"${ENV}={e}" if not value else str(e)) from None
        if is_postgres_url(text):
            locator = PostgresLocator.parse(text)
            if not postgres:
                _postgres_store(locator)
            return cls(Path(), locator)
        return cls(Path(text))

    def __str__(self) -> str:
        return str(self.postgres) if self.postgres is not None else str(self.path)

    def open_reader(self) -> CaptureReader:
        """The store's reader (list, show, export), on either backend; read-only, never migrates."""
        if self.postgres is not None:
            from tapfix.proxy.store.pg.reader import PostgresReader

            return PostgresReader(self.postgres)
        return SqliteReader(self.open_for_reading())

    def exists(self) -> bool:
        return self.path.exists()

    def open_for_reading(self) -> sqlite3.Connection:
        """Read-only, never creates or migrates (see `store.writer.open_for_reading`)."""
        try:
            return open_for_reading(self.path)
        except (OSError, sqlite3.Error) as e:
            raise _unusable(self.path, e, "read") from e

    def open_when_ready(self) -> sqlite3.Connection | None:
        """Read-only like `open_for_reading`, or None while no writer has made the store yet."""
        try:
            return open_when_ready(self.path)
        except (OSError, sqlite3.Error) as e:
            raise _unusable(self.path, e, "read") from e

    def open_for_writing(self) -> sqlite3.Connection:
        """Creates (mode 0600) and migrates when needed."""
        try:
            return open_for_writing(self.path)
        except (OSError, sqlite3.Error) as e:
            raise _unusable(self.path, e, "write to") from e

    def writer(self, *, wait: bool = True, **options: Any) -> CaptureWriter:
        """The store's `CaptureWriter` (`options`: its own). A PostgreSQL server that can't be reached yet
        is waited for (`wait`: the writer holds what comes and migrates once it is reached); without
        `wait` (`run --strict`) it is a `StoreError`, as an unusable SQLite path always is."""
        from tapfix.proxy.store.writer import CaptureWriter

        if self.postgres is not None:
            from tapfix.proxy.store.pg.writer import postgres_writer

            return postgres_writer(self.postgres, wait=wait, **options)
        try:
            return CaptureWriter(self.path, **options)
        except (OSError, sqlite3.Error) as e:
            raise _unusable(self.path, e, "write to") from e
