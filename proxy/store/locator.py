"""Where the capture store lives: what `--db` (or `$TAPFIX_DB`, or the default) names, and the store there.

Commands receive a `StoreLocator`, never a bare path, and ask it for the store (`backend()`, a
`StoreBackend`: store/backend.py), never for a connection, so no command knows which database it
talks to. A `postgresql://` or `postgres://` URL is a PostgreSQL locator (store/pg/locator.py:
parsing, and the password masked wherever it is shown); any other value that looks like a URL is
refused, naming its scheme (store/locator_url.py); anything else is a SQLite file. A command that
takes a PostgreSQL store passes `postgres=True`; the one that can't (`demo`, which keeps a SQLite
file of its own) is refused in one place (`_postgres_store`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator_url import NotAStoreLocator, refuse_url_like
from tapfix.proxy.store.pg.locator import PostgresLocator, is_postgres_url

if TYPE_CHECKING:
    from tapfix.proxy.store.backend import StoreBackend

DEFAULT_DB = "captures/tapfix.db"
ENV = "TAPFIX_DB"


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

    @classmethod
    def of(cls, db: StoreLocator | os.PathLike[str] | str) -> StoreLocator:
        """A locator as it is, or a SQLite file's path as one."""
        return db if isinstance(db, StoreLocator) else cls(Path(db))

    def __str__(self) -> str:
        return str(self.postgres) if self.postgres is not None else str(self.path)

    def backend(self) -> StoreBackend:
        """The store this locator names (nothing is opened yet)."""
        if self.postgres is not None:
            from tapfix.proxy.store.pg.store import PostgresStore

            return PostgresStore(self.postgres)
        from tapfix.proxy.store.sqlite.store import SqliteStore

        return SqliteStore(self.path)
