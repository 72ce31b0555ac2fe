"""`captures tail`'s read side on SQLite (proxy/store/sqlite/tail.py) on stores the real `CaptureWriter` wrote:
commit order (a replaced row comes again, where its new commit put it), filters that take attempts with their client
request, the `--since` cursors, and a store whose newest rows were deleted."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from tapfix.proxy.changes import Change
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.reader import CaptureFilter
from tapfix.proxy.store.sqlite.database import open_for_reading, open_when_ready
from tapfix.proxy.store.sqlite.tail import Tail, after_capture, completed_within, latest

from tests.unit.test_store_attempts import exchange, regenerated, write


def ids(tail: Tail) -> list[str]:
    return [row["id"] for row in tail.poll()]


def test_commit_order_not_id_order_and_a_replaced_row_comes_again(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    late, early = exchange(), exchange()  # ids sort late < early; commits go early first
    write(db, [early])
    conn = open_for_reading(db)
    tail = Tail(conn, 0, CaptureFilter())
    assert ids(tail) == [early.id] and ids(tail) == []
    write(db, [late])
    write(db, [early])  # `insert or replace`: its row is committed again, after `late`
    assert ids(tail) == [late.id, early.id]
    assert ids(tail) == []


def test_a_capture_written_again_is_replaced_whole_changes_and_all(tmp_path: Path) -> None:
    """A new row is one statement; one stored before is replaced, its old changes gone (not added to)."""
    db = tmp_path / "c.db"
    ex = exchange()
    ex.changes = [Change("request", "default_sampling", "$.temperature", None, 0.6, "x"), Change("request", "k", "$.a")]
    write(db, [ex])
    ex.changes = [Change("request", "default_sampling", "$.top_p", None, 0.95, "y")]
    write(db, [ex])
    conn = sqlite3.connect(db)
    assert conn.execute("select count(*) from exchanges").fetchone() == (1,)
    assert conn.execute("select path, reason from changes where exchange_id = ?", (ex.id,)).fetchall() == [
        ("$.top_p", "y")
    ]


def test_a_filter_takes_attempts_with_their_client_request(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    *attempts, parent = regenerated(attempts=2)
    other = exchange(flags={"runaway_length"})
    write(db, [parent, *attempts, other])  # as the recorder submits: the parent, then its attempts
    conn = open_for_reading(db)
    assert ids(Tail(conn, 0, CaptureFilter(flag="regenerated"))) == [parent.id, *(a.id for a in attempts)]
    assert ids(Tail(conn, 0, CaptureFilter(flag="runaway_length"))) == [other.id]
    assert ids(Tail(conn, 0, CaptureFilter(session="nobody"))) == []
    everything = ids(Tail(conn, 0, CaptureFilter()))
    assert everything == [parent.id, *(a.id for a in attempts), other.id]


def test_since_cursors(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    old = exchange(started_at=time.time() - 3600)  # arrived an hour ago; ended moments after
    first, second = exchange(), exchange()
    write(db, [old, first, second])
    conn = open_for_reading(db)
    assert ids(Tail(conn, latest(conn), CaptureFilter())) == []
    assert ids(Tail(conn, after_capture(conn, first.id), CaptureFilter())) == [second.id]
    assert ids(Tail(conn, completed_within(conn, 600), CaptureFilter())) == [first.id, second.id]
    assert ids(Tail(conn, completed_within(conn, 7200), CaptureFilter())) == [old.id, first.id, second.id]


def test_after_the_newest_rows_are_deleted_new_ones_are_still_seen(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    write(db, [exchange(), exchange()])
    conn = open_for_reading(db)
    tail = Tail(conn, latest(conn), CaptureFilter())
    with sqlite3.connect(db) as writer:  # a purge of everything
        writer.execute("delete from exchanges")
    assert ids(tail) == []
    fresh = exchange()
    write(db, [fresh])  # rowid 1 again
    assert ids(tail) == [fresh.id]


def test_a_store_not_made_yet_is_waited_for_and_a_foreign_one_refused(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    assert open_when_ready(db) is None  # no file
    db.touch()
    assert open_when_ready(db) is None  # an empty file: a writer is about to make it
    with sqlite3.connect(db) as conn:  # what sqlite-utils creates before the first migration commits
        conn.execute("create table _sqlite_migrations (migration_set text, name text, applied_at text)")
    assert open_when_ready(db) is None
    write(db, [exchange()])
    ready = open_when_ready(db)
    assert ready is not None and latest(ready) == 1
    foreign = tmp_path / "other.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("create table notes (text)")
    with pytest.raises(StoreError, match="not a tapfix capture database"):
        open_when_ready(foreign)
