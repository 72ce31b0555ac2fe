"""Where the capture store lives: what `--db` (or `$TAPFIX_DB`, or the default) names.

Commands receive a `StoreLocator`, never a bare path, and open the store through it, so a second
backend (a server instead of a SQLite file) plugs in here: a new kind of locator, parsed from the
same `--db` value, and the commands stay as they are. A `postgresql://` or `postgres://` URL is a
PostgreSQL locator (store/pg/locator.py: parsing, and the password masked wherever it is shown); the
PostgreSQL backend is not wired in yet, so `StoreLocator.resolve` refuses it in one place
(`_postgres_store`), which is what the backend replaces.

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
from tapfix.proxy.store.pg.locator import PostgresLocator, is_postgres_url
from tapfix.proxy.store.writer import StoreError, open_for_reading, open_for_writing

if TYPE_CHECKING:
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
    """The one place that refuses a PostgreSQL store: the backend's session replaces it."""
    raise StoreError(f"{locator}: PostgreSQL stores are not supported by this tapfix yet; pass --db with a SQLite file")


@dataclass(frozen=True)
class StoreLocator:
    path: Path

    @classmethod
    def resolve(cls, value: str | os.PathLike[str] | None = None) -> StoreLocator:
        """`--db VALUE`, else `$TAPFIX_DB`, else `captures/tapfix.db`; a PostgreSQL URL is refused until
        that backend is wired in (`StoreError`, one line, the password masked)."""
        text = os.fspath(value) if value else os.environ.get(ENV) or DEFAULT_DB
        if is_postgres_url(text):
            _postgres_store(PostgresLocator.parse(text))
        return cls(Path(text))

    def __str__(self) -> str:
        return str(self.path)

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

    def writer(self, **options: Any) -> CaptureWriter:
        from tapfix.proxy.store.writer import CaptureWriter

        try:
            return CaptureWriter(self.path, **options)
        except (OSError, sqlite3.Error) as e:
            raise _unusable(self.path, e, "write to") from e
