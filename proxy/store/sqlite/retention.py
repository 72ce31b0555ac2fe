"""Retention on SQLite: purge old exchanges (by age or to a size cap) without ever breaking a kept body.

Bodies are stored as prefix/suffix deltas against an earlier body of the same session
(`bodies.base_id`), so a body nobody references any more may still be the base, or the base of a
base, of a body that is kept. `purge` therefore deletes exchanges (and their changes) first, then
only the bodies outside the transitive closure "referenced by a kept exchange, plus every base on
the way down". Every kept exchange's bodies reconstruct byte for byte afterwards (tests prove it).

The capture writer calls `Retention.maybe_run` from its own thread between batches, so traffic
never waits on it: the event loop only enqueues, and a purge works in small transactions so the
queue keeps draining. `tapfix captures purge` calls `purge` from another process; SQLite's write
lock serializes it with the writer (the writer checks a delta base still exists before using it).

Deleted rows free pages inside the file (SQLite reuses them), so a size cap bounds the file at
about `max_bytes`; only `VACUUM` (`tapfix captures purge --vacuum`) gives space back to the disk.

Counts come from SQLite's `changes()`: Python's `rowcount` is -1 for a `WITH … DELETE`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tapfix.proxy.store.retention import PurgeReport
from tapfix.proxy.store.sqlite.database import empty_store_bytes, used_bytes

BODY_COLUMNS = ("request_body_id", "forwarded_body_id", "response_body_id", "client_response_body_id")
_NEEDED = (
    "with recursive needed(id) as ("
    + " union ".join(f"select {c} from exchanges where {c} is not null" for c in BODY_COLUMNS)
    + " union select b.base_id from bodies b join needed n on b.id = n.id where b.base_id is not null)"
)


def store_floor(conn: sqlite3.Connection) -> int:
    """This store's floor: the empty store at its page size."""
    return empty_store_bytes(int(conn.execute("pragma page_size").fetchone()[0]))


def purge(
    conn: sqlite3.Connection,
    older_than_s: float | None = None,
    max_bytes: int | None = None,
    *,
    now: float | None = None,
    batch: int = 1000,
) -> PurgeReport:
    """Delete exchanges older than `older_than_s`, then the oldest until the store uses ≤ `max_bytes`.

    Works in transactions of at most `batch` exchanges so a concurrent writer waits at most one
    small step. Never raises on an empty or already-purged store; raises sqlite3 errors as they come.
    """
    started = time.monotonic()
    report = PurgeReport(bytes_before=used_bytes(conn))
    if older_than_s is not None:
        if older_than_s < 0:
            raise ValueError("older_than_s must be ≥ 0")
        report.cutoff = (time.time() if now is None else now) - older_than_s
        while True:
            ids = [
                r[0]
                for r in conn.execute(
                    "select id from exchanges where ts < ? order by ts limit ?", (report.cutoff, batch)
                )
            ]
            if not ids:
                break
            _step(conn, ids, report)
        if report.exchanges:
            report.reasons.append(f"older than {older_than_s:g}s")
    if max_bytes is not None:
        before = report.exchanges
        _collect_in_tx(conn, report)  # bodies freed by earlier runs count before deciding
        while used_bytes(conn) > max_bytes:
            # Delete a share of the oldest exchanges proportional to the overshoot, at least a few.
            total = conn.execute("select count(*) from exchanges").fetchone()[0]
            if total == 0:
                break
            over = 1 - max_bytes / max(used_bytes(conn), 1)
            n = max(8, min(batch, int(total * over) + 1))
            ids = [r[0] for r in conn.execute("select id from exchanges order by ts, id limit ?", (n,))]
            _step(conn, ids, report)
        if report.exchanges > before:
            report.reasons.append(f"over {max_bytes} bytes")
    report.bytes_after = used_bytes(conn)
    report.seconds = round(time.monotonic() - started, 3)
    return report


def dry_run(
    conn: sqlite3.Connection,
    older_than_s: float | None = None,
    max_bytes: int | None = None,
    *,
    now: float | None = None,
) -> PurgeReport:
    """What `purge` would delete, counted by the same code on a snapshot copy: the store is not written.

    The copy (SQLite's backup, a read that never blocks the writer in WAL mode) goes to a private
    temporary directory next to the store, so it needs as much free disk as the store uses, and it
    is removed afterwards. Counting on the live store inside a rolled-back transaction would hold
    the write lock for the whole run, and a capture writer waiting past its busy timeout loses captures.
    """
    main = conn.execute("pragma database_list").fetchone()[2]
    try:
        snapshot_dir = tempfile.TemporaryDirectory(prefix=".tapfix-dry-run-", dir=Path(main).parent if main else None)
    except OSError:  # a directory this user can't write to: the system's temporary directory
        snapshot_dir = tempfile.TemporaryDirectory(prefix="tapfix-dry-run-")
    with snapshot_dir as tmp:
        copy = sqlite3.connect(str(Path(tmp) / "snapshot.db"), isolation_level=None)
        try:
            conn.backup(copy)
            report = purge(copy, older_than_s, max_bytes, now=now)
        finally:
            copy.close()
    report.dry_run = True
    return report


def _step(conn: sqlite3.Connection, ids: list[str], report: PurgeReport) -> None:
    """One transaction: these exchanges, their changes, orphaned sessions, then unneeded bodies."""
    with _transaction(conn):
        marks = ",".join("?" * len(ids))
        sessions = [
            r[0]
            for r in conn.execute(
                f"select distinct session_id from exchanges where id in ({marks}) and session_id is not null", ids
            )
        ]
        report.changes += _deleted(conn, f"delete from changes where exchange_id in ({marks})", ids)
        if conn.execute("select 1 from sqlite_master where type = 'table' and name = 'choices'").fetchone():
            conn.execute(f"delete from choices where exchange_id in ({marks})", ids)  # their answers' text
        report.exchanges += _deleted(conn, f"delete from exchanges where id in ({marks})", ids)
        if sessions:
            smarks = ",".join("?" * len(sessions))
            report.sessions += _deleted(
                conn,
                f"delete from sessions where id in ({smarks})"
                " and not exists (select 1 from exchanges e where e.session_id = sessions.id)",
                sessions,
            )
            conn.execute(
                f"update sessions set exchanges = (select count(*) from exchanges e where e.session_id = sessions.id),"
                f" first_at = (select min(started_at) from exchanges e where e.session_id = sessions.id)"
                f" where id in ({smarks})",
                sessions,
            )
        _collect(conn, report)


def _collect_in_tx(conn: sqlite3.Connection, report: PurgeReport) -> None:
    with _transaction(conn):
        _collect(conn, report)


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """Committed at the end, rolled back on any error; the write lock taken up front."""
    _begin(conn)
    try:
        yield
        conn.execute("commit")
    except BaseException:
        _rollback(conn)
        raise


def _collect(conn: sqlite3.Connection, report: PurgeReport) -> None:
    """Delete bodies neither referenced by an exchange nor (transitively) the base of one that is."""
    report.bodies += _deleted(conn, f"{_NEEDED} delete from bodies where id not in (select id from needed)")
    report.kept_bases = conn.execute(
        f"{_NEEDED} select count(*) from needed where id not in ("
        + " union ".join(f"select {c} from exchanges where {c} is not null" for c in BODY_COLUMNS)
        + ")"
    ).fetchone()[0]


def _deleted(conn: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> int:
    """Rows the statement deleted, from `changes()` (`rowcount` is -1 for a statement that starts WITH)."""
    conn.execute(sql, args)
    return int(conn.execute("select changes()").fetchone()[0])


def _begin(conn: sqlite3.Connection) -> None:
    if not conn.in_transaction:
        conn.execute("begin immediate")


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("rollback")
    except sqlite3.Error:  # pragma: no cover - rollback of a broken connection
        pass


def vacuum(conn: sqlite3.Connection) -> None:
    """Give freed pages back to the disk. Rewrites the whole file: takes the write lock for a while."""
    if conn.in_transaction:
        conn.execute("commit")
    conn.execute("vacuum")
    conn.execute("pragma wal_checkpoint(truncate)")


def file_bytes(conn: sqlite3.Connection) -> int:
    """The file's size in pages (after a VACUUM nothing in it is free)."""
    return int(conn.execute("pragma page_count").fetchone()[0] * conn.execute("pragma page_size").fetchone()[0])
