"""Retention on PostgreSQL: drop whole day partitions, delete rows only in the day that straddles the cutoff.

The four day-partitioned tables (store/pg/schema.py) share their daily bounds, and a delta never
crosses a day (store/pg/body_writer.py), so every day older than the cutoff's day goes at once: its
partitions of `exchanges`, `bodies`, `changes` and `choices` are dropped in one transaction, which
frees their disk immediately and leaves no delta of another day without its base. A drop holds the
parent tables exclusively for a moment; it waits at most `LOCK_TIMEOUT` for them (a long browse query),
else it fails, is logged, and is tried at the next run. In the day that
straddles the cutoff, and in the default partitions (rows of days without a partition: a skewed
clock), exchanges older than the cutoff are deleted with their changes and choices, then the bodies
of those days that nothing needs any more: neither referenced by a kept exchange of the day nor,
transitively, the base of one that is (the closure store/retention.py computes on SQLite, per day).

A writer may be about to store a delta on a body the collect step finds unneeded (a session idle past
the cutoff, resuming now). On SQLite the write lock serializes the two; here the collect step holds
`RETENTION_LOCK` exclusively, and the body writer takes it shared before it checks that its base is
still stored (store/pg/body_writer.py), holding it to its commit: the check sees the base gone, or
the collect step sees the new delta and keeps the base.

Sessions as on SQLite: a session none of whose exchanges is left is deleted, the others get their
count and first time again.

Size (`max_size`): the store's size is what its tables use on disk (`pg_total_relation_size` of
every partition and index). Deleting rows doesn't shrink a table (VACUUM only makes the space
reusable), so a cap enforced by deleting rows would delete everything and still be over; on
PostgreSQL a size cap drops the oldest whole days, never today's, until the store fits.

Counts: `rowcount` (PostgreSQL reports it for every DELETE, WITH or not).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterable
from typing import Any

import psycopg
from tapfix.proxy.store.pg.body_writer import utc_day
from tapfix.proxy.store.pg.schema import RETENTION_LOCK
from tapfix.proxy.store.retention import PurgeReport

log = logging.getLogger("tapfix.retention")

DAY_TABLES = ("exchanges", "bodies", "changes", "choices")
TAPFIX_TABLES = (*DAY_TABLES, "sessions")
# A purge waits at most this for a lock, then fails and is tried again later. Short: dropping a partition needs
# the parent table exclusively, and while it waits every other query of the table queues behind it.
LOCK_TIMEOUT = "2s"

PGConn = psycopg.Connection[tuple[Any, ...]]
_BODY_COLUMNS = "request_body_id, forwarded_body_id, response_body_id, client_response_body_id"
_NEEDED_OF_DAY = f"""
with recursive needed(id) as (
    select unnest(array[{_BODY_COLUMNS}]) from exchanges where started_at >= %(lo)s and started_at < %(hi)s
    union
    select b.base_id from bodies b join needed n on b.id = n.id where b.day = %(day)s and b.base_id is not null
)
"""


def used_bytes(conn: PGConn) -> int:
    """What the store's tables use on disk: every partition, its TOAST and its indexes, and `sessions`."""
    row = conn.execute(
        "select coalesce(sum(pg_total_relation_size(t.relid)), 0) from unnest(%s::text[]) n,"
        " lateral pg_partition_tree(n::regclass) t",
        (list(TAPFIX_TABLES),),
    ).fetchone()
    return int(row[0]) if row else 0


def day_partitions(conn: PGConn) -> list[datetime.date]:
    """The days that have partitions (`exchanges_YYYYMMDD`), oldest first."""
    rows = conn.execute(
        "select c.relname from pg_inherits i join pg_class c on c.oid = i.inhrelid"
        " where i.inhparent = 'exchanges'::regclass and c.relname ~ '^exchanges_[0-9]{8}$'"
    ).fetchall()
    return sorted(datetime.datetime.strptime(str(r[0])[-8:], "%Y%m%d").date() for r in rows)


def purge(
    conn: PGConn,
    older_than_s: float | None = None,
    max_bytes: int | None = None,
    *,
    now: float | None = None,
    batch: int = 1000,
) -> PurgeReport:
    """Drop the days before the cutoff's, delete what is older than the cutoff in its day and in the
    default partitions, then drop the oldest days (never today's) while the store is over `max_bytes`.

    `conn` is in autocommit mode (each step is its own transaction, so writers wait at most one step)."""
    started = time.monotonic()
    now = time.time() if now is None else now
    report = PurgeReport(bytes_before=used_bytes(conn))
    if older_than_s is not None:
        if older_than_s < 0:
            raise ValueError("older_than_s must be ≥ 0")
        report.cutoff = now - older_than_s
        cutoff_day = utc_day(report.cutoff)
        before = report.exchanges
        for day in day_partitions(conn):
            if day < cutoff_day:
                _drop_day(conn, day, report)
        _delete_older(conn, report.cutoff, report, batch)
        if report.exchanges > before:
            report.reasons.append(f"older than {older_than_s:g}s")
    if max_bytes is not None:
        before = report.exchanges
        today = utc_day(now)
        for day in day_partitions(conn):
            if day >= today or used_bytes(conn) <= max_bytes:
                break
            _drop_day(conn, day, report)
        if report.exchanges > before or report.days_dropped:
            report.reasons.append(f"over {max_bytes} bytes")
    report.bytes_after = used_bytes(conn)
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _drop_day(conn: PGConn, day: datetime.date, report: PurgeReport) -> None:
    """One transaction: the day's four partitions, counted first, then the sessions they leave."""
    suffix = day.strftime("%Y%m%d")
    with conn.transaction():
        conn.execute(f"set local lock_timeout = '{LOCK_TIMEOUT}'".encode())
        counts = {}
        for table in DAY_TABLES:
            row = conn.execute(f"select count(*) from {table}_{suffix}".encode()).fetchone()
            counts[table] = int(row[0]) if row else 0
        sessions = [
            str(r[0])
            for r in conn.execute(
                f"select distinct session_id from exchanges_{suffix} where session_id is not null".encode()
            )
        ]
        for table in DAY_TABLES:
            conn.execute(f"drop table {table}_{suffix}".encode())
        _sessions_after(conn, sessions, report)
    report.exchanges += counts["exchanges"]
    report.changes += counts["changes"]
    report.bodies += counts["bodies"]
    report.days_dropped.append(day.isoformat())


def _delete_older(conn: PGConn, cutoff: float, report: PurgeReport, batch: int) -> None:
    """The straddling day and the default partitions: exchanges older than `cutoff`, `batch` at a time,
    then the bodies of the days they were in."""
    cutoff_at = datetime.datetime.fromtimestamp(cutoff, datetime.UTC)
    touched: set[datetime.date] = set()
    while True:
        with conn.transaction():
            conn.execute(f"set local lock_timeout = '{LOCK_TIMEOUT}'".encode())
            gone = conn.execute(
                "delete from exchanges where (id, started_at) in"
                " (select id, started_at from exchanges where started_at < %s order by started_at limit %s)"
                " returning id, session_id, (started_at at time zone 'UTC')::date",
                (cutoff_at, batch),
            ).fetchall()
            if not gone:
                break
            ids = [str(r[0]) for r in gone]
            days = sorted({r[2] for r in gone})
            touched.update(days)
            report.exchanges += len(gone)
            report.changes += _deleted(
                conn, "delete from changes where exchange_id = any(%s) and day = any(%s)", (ids, days)
            )
            conn.execute("delete from choices where exchange_id = any(%s) and day = any(%s)", (ids, days))
            _sessions_after(conn, sorted({str(r[1]) for r in gone if r[1] is not None}), report)
    for day in sorted(touched):
        with conn.transaction():
            conn.execute(f"set local lock_timeout = '{LOCK_TIMEOUT}'".encode())
            conn.execute("select pg_advisory_xact_lock(%s)", (RETENTION_LOCK,))
            _collect_day(conn, day, report)


def _collect_day(conn: PGConn, day: datetime.date, report: PurgeReport) -> None:
    """Delete the day's bodies outside the closure of what its kept exchanges need."""
    lo = datetime.datetime.combine(day, datetime.time(), datetime.UTC)
    args = {"lo": lo, "hi": lo + datetime.timedelta(days=1), "day": day}
    report.bodies += _deleted(
        conn,
        _NEEDED_OF_DAY + " delete from bodies where day = %(day)s"
        " and id not in (select id from needed where id is not null)",
        args,
    )
    row = conn.execute(
        _NEEDED_OF_DAY + " select count(*) from needed where id is not null and id not in"
        f" (select r from exchanges, unnest(array[{_BODY_COLUMNS}]) r"
        " where started_at >= %(lo)s and started_at < %(hi)s and r is not null)",
        args,
    ).fetchone()
    report.kept_bases += int(row[0]) if row else 0


def _sessions_after(conn: PGConn, sessions: Iterable[str], report: PurgeReport) -> None:
    """As store/retention.py's `_step`: sessions left without exchanges go, the others are recounted."""
    sessions = list(sessions)
    if not sessions:
        return
    report.sessions += _deleted(
        conn,
        "delete from sessions where id = any(%s)"
        " and not exists (select 1 from exchanges e where e.session_id = sessions.id)",
        (sessions,),
    )
    conn.execute(
        "update sessions set exchanges = (select count(*) from exchanges e where e.session_id = sessions.id),"
        " first_at = (select min(started_at) from exchanges e where e.session_id = sessions.id)"
        " where id = any(%s)",
        (sessions,),
    )


def _deleted(conn: PGConn, sql: str, args: Any) -> int:
    return int(conn.execute(sql.encode(), args).rowcount)


def vacuum(conn: PGConn) -> None:
    """`VACUUM (ANALYZE)` of tapfix's tables (every partition): deleted rows' space becomes reusable by
    the same table; only trailing empty pages go back to the disk. Not FULL: that rewrites each table
    under an exclusive lock, stopping every writer and reader while it runs."""
    conn.execute(f"vacuum (analyze) {', '.join(TAPFIX_TABLES)}".encode())
