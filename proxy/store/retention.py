"""Retention: purge old exchanges (by age or to a size cap) without ever breaking a kept body.

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

Limits that would delete captures as fast as they arrive are refused where the user gives them
(`check_max_age`, `check_max_size`): an age under a minute, or a size under what the empty store
alone uses (its floor: the schema's tables and indexes, measured on a fresh store, not assumed).
Counts come from SQLite's `changes()`: Python's `rowcount` is -1 for a `WITH … DELETE`.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tapfix.proxy.quantities import human_bytes, parse_duration, parse_size

log = logging.getLogger("tapfix.retention")

BODY_COLUMNS = ("request_body_id", "forwarded_body_id", "response_body_id", "client_response_body_id")
_NEEDED = (
    "with recursive needed(id) as ("
    + " union ".join(f"select {c} from exchanges where {c} is not null" for c in BODY_COLUMNS)
    + " union select b.base_id from bodies b join needed n on b.id = n.id where b.base_id is not null)"
)
Purge = Callable[..., "PurgeReport"]  # (conn, older_than_s, max_bytes, *, now) -> PurgeReport
MIN_AGE_S = 60.0  # a shorter --max-age purges each capture moments after it is written


def check_max_age(seconds: float | None, name: str = "--max-age") -> None:
    """Refuse an age under MIN_AGE_S (ValueError naming `name` and the minimum)."""
    if seconds is not None and seconds < MIN_AGE_S:
        raise ValueError(
            f"{name} {seconds:g}s is below the minimum, 1 minute ({MIN_AGE_S:g}s): "
            "a shorter age purges each capture moments after it is written"
        )


@functools.cache
def empty_store_bytes(page_size: int = 4096) -> int:
    """What a store with no capture uses (schema, indexes, migration records): a size cap's floor."""
    from tapfix.proxy.store.database import tapfix_migrations

    migrations = tapfix_migrations()  # first: it imports sqlite-utils without numpy
    from sqlite_utils import Database

    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute(f"pragma page_size = {int(page_size)}")
        migrations.apply(Database(conn))
        return used_bytes(conn)
    finally:
        conn.close()


def store_floor(conn: sqlite3.Connection) -> int:
    """This store's floor: the empty store at its page size."""
    return empty_store_bytes(int(conn.execute("pragma page_size").fetchone()[0]))


def check_max_size(max_bytes: int | None, floor: int | None = None, name: str = "--max-size") -> None:
    """Refuse a size cap under the empty store's floor: it would delete every capture and still be over."""
    floor = empty_store_bytes() if floor is None else floor
    if max_bytes is not None and max_bytes < floor:
        raise ValueError(
            f"{name} {max_bytes} bytes ({human_bytes(max_bytes)}) is below the store's floor: the empty store "
            f"alone uses {floor} bytes ({human_bytes(floor)}), so every capture would be deleted; "
            f"give at least {floor} bytes"
        )


@dataclass
class PurgeReport:
    dry_run: bool = False  # counted on a snapshot copy: the store itself is unchanged
    exchanges: int = 0
    changes: int = 0
    bodies: int = 0
    sessions: int = 0
    kept_bases: int = 0  # unreferenced bodies kept because a kept body is a delta on them
    bytes_before: int = 0  # bytes in use (pages minus free pages), not the file size
    bytes_after: int = 0
    seconds: float = 0.0
    cutoff: float | None = None  # unix time: exchanges older than this were deleted
    reasons: list[str] = field(default_factory=list)
    days_dropped: list[str] = field(default_factory=list)  # PostgreSQL: the UTC days whose partitions went whole

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        text = (
            f"{'would purge' if self.dry_run else 'purged'} {self.exchanges} exchange(s), {self.changes} change(s), "
            f"{self.bodies} body(ies), {self.sessions} session(s); "
            f"{'would keep' if self.dry_run else 'kept'} {self.kept_bases} delta base(s) still needed; "
            f"in use {self.bytes_before} → {self.bytes_after} bytes in {self.seconds:.2f}s"
        )
        if self.days_dropped:
            text += f"; dropped the day partitions of {', '.join(self.days_dropped)}"
        return text + ("; dry run: nothing was deleted" if self.dry_run else "")


def used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes the database uses: pages minus free pages (deletes free pages, VACUUM shrinks the file)."""
    page_size = conn.execute("pragma page_size").fetchone()[0]
    pages = conn.execute("pragma page_count").fetchone()[0]
    free = conn.execute("pragma freelist_count").fetchone()[0]
    return int((pages - free) * page_size)


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
    _begin(conn)
    try:
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
        conn.execute("commit")
    except BaseException:
        _rollback(conn)
        raise


def _collect_in_tx(conn: sqlite3.Connection, report: PurgeReport) -> None:
    _begin(conn)
    try:
        _collect(conn, report)
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


@dataclass
class Retention:
    """Limits the capture writer enforces from its own thread, at most once per `every_s` seconds."""

    max_age_s: float | None = None
    max_bytes: int | None = None
    every_s: float = 60.0
    last_run: float = 0.0
    runs: int = 0
    purged: int = 0
    last_error: str | None = None
    days_dropped: int = 0  # PostgreSQL: day partitions dropped whole (their exchanges count in `purged`)

    @classmethod
    def from_config(cls, table: dict[str, Any] | None) -> Retention | None:
        """`[retention] max_age = "7d"`, `max_size = "2G"`, `check_every = "60s"` (all optional)."""
        if not table:
            return None
        age, size = table.get("max_age"), table.get("max_size")
        every = table.get("check_every", 60)
        if age is None and size is None:
            return None
        retention = cls(
            max_age_s=parse_duration(str(age)) if age is not None else None,
            max_bytes=parse_size(str(size)) if size is not None else None,
            every_s=parse_duration(str(every)),
        )
        check_max_age(retention.max_age_s, "max_age")
        check_max_size(retention.max_bytes, name="max_size")
        return retention

    def due(self, now: float) -> bool:
        return now - self.last_run >= self.every_s

    def maybe_run(self, conn: Any, now: float | None = None, *, purge_with: Purge | None = None) -> PurgeReport | None:
        """Run when due; never raises (a failed purge is counted, logged, and tried again later).
        `purge_with`: the backend's (SQLite's below by default; PostgreSQL's is store/pg/retention.py)."""
        now = time.time() if now is None else now
        if not self.due(now):
            return None
        self.last_run = now
        try:
            report = (purge_with or purge)(conn, self.max_age_s, self.max_bytes, now=now)
        except Exception as e:  # noqa: BLE001 - retention must never stop the writer
            self.last_error = f"{type(e).__name__}: {e}"
            log.error("retention purge failed: %s", e)
            return None
        self.runs += 1
        self.purged += report.exchanges
        self.days_dropped += len(report.days_dropped)
        if report.exchanges:
            log.info("retention: %s", report)
        return report

    def health(self) -> dict[str, Any]:
        return {
            "max_age_s": self.max_age_s,
            "max_bytes": self.max_bytes,
            "runs": self.runs,
            "purged": self.purged,
            "days_dropped": self.days_dropped,
            "last_error": self.last_error,
        }
