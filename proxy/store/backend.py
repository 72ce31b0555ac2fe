"""The one interface of a capture store, whichever database holds it: `StoreBackend`.

Commands get a store from their `--db` (`StoreLocator.backend()`, store/locator.py) and ask it; none
of them knows which database it is. Each backend implements all of it: SQLite's in store/sqlite/
(`SqliteStore`), PostgreSQL's in store/pg/ (`PostgresStore`), with the parts it hands out (parts.py:
a writer's connection, readers, a tail, the browser's queries). What is the same on every backend is
written once, beside this module: the writer's logic (writer.py, over a `WriteBackend`), the reader's
(reader.py `CaptureReader`), a copy's (copy.py), retention's limits and report (retention.py), the
browser's pages (pages.py) and filters (filters.py). The same exchanges give the same rows, bytes and
pages on every backend (tests/unit/test_store_reader_backends.py, tests/unit/test_browse_backends.py).

Errors: a backend raises `StoreError` (store/errors.py) with one line to show, its password masked,
for whatever its database says where a command meets it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tapfix.proxy.store.check import StoreCheck
    from tapfix.proxy.store.copy import CopySource, CopyTarget
    from tapfix.proxy.store.parts import BrowseQueries, Follower
    from tapfix.proxy.store.reader import CaptureFilter, CaptureReader
    from tapfix.proxy.store.retention import PurgeReport
    from tapfix.proxy.store.writer import CaptureWriter

Since = str | float | None  # `captures tail --since`: a capture id (or prefix), an age in seconds, or "from now"


class StoreBackend(Protocol):
    """One capture store: everything tapfix does with one goes through here."""

    name: str  # "sqlite" or "postgresql", for health and logs
    location: str  # the store as shown: a path, or a URL with its password masked
    errors: tuple[type[Exception], ...]  # what its database may raise half way through a long job (a copy)

    def writer(self, *, wait: bool = True, **options: Any) -> CaptureWriter:
        """The store's `CaptureWriter` (`options`: its own), migrating the store when needed. A server
        that can't be reached yet is waited for (`wait`: the writer holds what comes); without `wait` it
        is `StoreUnreachable`. An unusable store is a `StoreError`."""
        ...

    def reader(self) -> CaptureReader:
        """A reader (list, show, export): read-only, never migrates; `StoreError` when there is no store."""
        ...

    def tail(self, since: Since, filters: CaptureFilter) -> Follower:
        """`captures tail` from `since` (a capture id or prefix: `CaptureNotFound` when the store lacks it).
        A store that a writer hasn't made yet is waited for (its follower's `poll` is None meanwhile)."""
        ...

    def purge(
        self, max_age_s: float | None, max_bytes: int | None, *, vacuum: bool = False, dry_run: bool = False
    ) -> PurgeReport:
        """`captures purge`: delete what is older than `max_age_s`, then the oldest while the store uses
        more than `max_bytes`, then give space back (`vacuum`); `dry_run` counts what would go.
        `LimitRefused` (store/retention.py) for a `max_bytes` under the store's floor."""
        ...

    def schema_version(self) -> str | None:
        """The SQLite migration whose schema the store reaches (None: no store there yet); read-only."""
        ...

    def copy_source(self) -> CopySource: ...
    def copy_target(self) -> CopyTarget:
        """The store as a copy's target: made and migrated when new, as its writer would."""
        ...

    def browse(self, *, search: bool = True, index_path: Path | None = None, background: bool = True) -> BrowseQueries:
        """The browser's queries. `search`, `index_path`, `background`: a search index the store keeps
        for the browser (SQLite's sidecar file; PostgreSQL's writer keeps search columns itself)."""
        ...

    def check(self, timeout: float) -> StoreCheck:
        """`tapfix check --db`: reachable, and at which schema; read-only, never raises."""
        ...

    def same_store(self, other: StoreBackend) -> bool: ...
    def scrub(self, text: str) -> str:
        """`text` with the store's password masked wherever it appears."""
        ...

    def as_argument(self) -> str:
        """The store as a command line's `--db` shows it (a file's absolute path, a masked URL)."""
        ...
