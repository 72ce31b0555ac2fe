"""Opening a SQLite capture store, and knowing whose it is: a store knows its own version.

Every tapfix store records its applied migrations in sqlite-utils' `_sqlite_migrations` table (set
"tapfix"). Before anything is read or written, that record is checked:

- no table at all (a missing path, a zero-length file): a new store, migrated by the first writer;
- tables but no tapfix record: someone else's database. It is refused and left untouched (no
  migration, not even WAL mode), so `--db` pointed at the wrong file can't change it;
- an applied migration this tapfix doesn't know: a newer tapfix migrated it, and this one would fail
  every write (or misread it). Refused, naming the migration;
- fewer migrations than this tapfix knows: an older store. A writer migrates it; readers read it as
  it is (they don't depend on tables a later migration added).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.sqlite.sqlite_utils_lite import MIGRATION_SET

if TYPE_CHECKING:
    from sqlite_utils.migrations import Migrations

BUSY_TIMEOUT_MS = 5000


def open_for_writing(path: Path | str) -> sqlite3.Connection:
    """Open (creating with mode 0600) and migrate: only a process that writes migrates."""
    path = Path(path)
    if str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    with _closed_on_error(conn, f"{path}: not a usable tapfix capture database"):
        conn.execute(f"pragma busy_timeout = {BUSY_TIMEOUT_MS}")
        check_store(conn, path)  # before WAL mode or a migration touches the file
        conn.execute("pragma journal_mode = wal")
        conn.execute("pragma synchronous = normal")
        conn.execute("pragma journal_size_limit = 8388608")
        conn.execute("pragma foreign_keys = off")
        migrations = tapfix_migrations()
        from sqlite_utils import Database

        migrations.apply(Database(conn))
    return conn


@contextlib.contextmanager
def _closed_on_error(conn: sqlite3.Connection, unusable: str) -> Iterator[None]:
    """The connection closed on any error; the database's own as a `StoreError` saying `unusable`."""
    try:
        yield
    except StoreError:
        conn.close()
        raise
    except sqlite3.DatabaseError as e:
        conn.close()
        raise StoreError(f"{unusable} ({e})") from e


def unusable(path: Path, e: Exception, doing: str) -> StoreError:
    """What the operating system or SQLite said about a path it can't use, as one line naming the cause."""
    return StoreError(f"{path}: can't {doing} the capture database ({_reason(path, e)})")


def _reason(path: Path, e: Exception) -> str:
    if path.is_dir():
        return "that is a folder; name a file in it"
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            return f"{parent} is a file, not a folder"
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def read_only_uri(path: Path | str) -> str:
    """A `file:` URI with the path percent-encoded: a `?`, `#` or `%` in a folder name stays part of it."""
    return Path(path).absolute().as_uri() + "?mode=ro"


def open_for_reading(path: Path | str) -> sqlite3.Connection:
    """Read-only: never migrates, never takes the write lock."""
    path = Path(path)
    if not path.exists():
        raise StoreError(f"no capture database at {path} (run `tapfix run` or `tapfix demo` first, or pass --db)")
    conn = _read_only(path)
    if conn is None:
        raise StoreError(f"no captures in {path} yet: it is empty (run `tapfix run` or `tapfix demo` first)")
    return conn


def open_when_ready(path: Path | str) -> sqlite3.Connection | None:
    """`open_for_reading` for a reader that waits for the store (`captures tail`): None while there is
    none yet (no file, or one a writer hasn't migrated yet); `StoreError` for what no wait would fix."""
    path = Path(path)
    return _read_only(path) if path.exists() else None


def _read_only(path: Path) -> sqlite3.Connection | None:
    """A read-only connection to a tapfix store, or None for an empty database (a new store)."""
    conn = sqlite3.connect(read_only_uri(path), uri=True, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    with _closed_on_error(conn, f"{path} is not a tapfix capture database"):
        conn.execute(f"pragma busy_timeout = {BUSY_TIMEOUT_MS}")
        if check_store(conn, path):
            return conn
    conn.close()
    return None


def check_store(conn: sqlite3.Connection, path: Path | str) -> bool:
    """False for an empty database (a new store), True for a tapfix store this version can use;
    `StoreError` for anything else (see the module docstring)."""
    tables = [
        str(r[0])
        for r in conn.execute("select name from sqlite_master where type in ('table', 'view') order by name")
        if not str(r[0]).startswith("sqlite_")
    ]
    if not tables:
        return False
    applied: list[str] = []
    if "_sqlite_migrations" in tables:
        applied = [
            str(r[0])
            for r in conn.execute(
                "select name from _sqlite_migrations where migration_set = ? order by rowid", (MIGRATION_SET,)
            )
        ]
    if not applied and tables == ["_sqlite_migrations"]:
        return False  # a writer is creating it: its migrations table comes first, then each migration
    if not applied:
        shown = ", ".join(tables[:8]) + (f" and {len(tables) - 8} more" if len(tables) > 8 else "")
        raise StoreError(
            f"{path} is not a tapfix capture database (it has tables {shown}, and no record of tapfix's"
            " migrations): tapfix leaves it as it is; pass --db with a new file or one tapfix created"
        )
    unknown = [name for name in applied if name not in known_migrations()]
    if unknown:
        raise StoreError(
            f"{path} was migrated by a newer tapfix: migration {', '.join(unknown)} is unknown to tapfix"
            f" {_version()}; upgrade tapfix to use this database, or pass another --db"
        )
    return True


@functools.cache
def known_migrations() -> frozenset[str]:
    """The migrations this tapfix ships (all of them are pending on an empty database)."""
    migrations = tapfix_migrations()
    from sqlite_utils import Database

    return frozenset(m.name for m in migrations.pending(Database(memory=True)))


def used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes the database uses: pages minus free pages (deletes free pages, VACUUM shrinks the file)."""
    page_size = conn.execute("pragma page_size").fetchone()[0]
    pages = conn.execute("pragma page_count").fetchone()[0]
    free = conn.execute("pragma freelist_count").fetchone()[0]
    return int((pages - free) * page_size)


@functools.cache
def empty_store_bytes(page_size: int = 4096) -> int:
    """What a store with no capture uses (schema, indexes, migration records): a size cap's floor."""
    migrations = tapfix_migrations()  # first: it imports sqlite-utils without numpy
    from sqlite_utils import Database

    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute(f"pragma page_size = {int(page_size)}")
        migrations.apply(Database(conn))
        return used_bytes(conn)
    finally:
        conn.close()


def latest_version() -> str:
    """The schema this tapfix's stores reach, named by SQLite's last migration (on every backend: a
    PostgreSQL store's version is the SQLite migration its own set reaches, store/pg/schema.py `REACHES`)."""
    migrations = tapfix_migrations()
    from sqlite_utils import Database

    return str(list(migrations.pending(Database(memory=True)))[-1].name)


def tapfix_migrations() -> Migrations:
    """The store's migrations (store/sqlite/schema.py), imported on first use: sqlite-utils costs a command that
    never migrates a store (`tapfix --help`) most of its start-up (schema.py imports it without numpy)."""
    from tapfix.proxy.store.sqlite.schema import migrations

    return migrations


def _version() -> str:
    import importlib.metadata  # only for the refusal's message

    try:
        return importlib.metadata.version("tapfix")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "(this version)"
