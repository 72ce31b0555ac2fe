"""`captures tail`'s read side on PostgreSQL (store/pg/tail.py), on a real server and stores the real
`postgres_writer` wrote: a transaction that commits after a later one is still shown, once, before it
(where a sequence number drawn at insert would have lost it); a replaced row comes again; filters take
attempts with their client request; the `--since` cursors."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.pg.reader import PostgresReader
from tapfix.proxy.store.pg.tail import PostgresTail, after_capture, completed_within, latest
from tapfix.proxy.store.pg.writer import postgres_writer
from tapfix.proxy.store.reader import CaptureFilter

from tests.support.postgres import PostgresServer
from tests.unit.test_store_attempts import exchange, regenerated

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def url(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    return postgres.create_database("tail_" + request.node.name[5:35].lower())


@pytest.fixture
def reader(url: str) -> Iterator[PostgresReader]:
    write(url, [])  # a writer makes the store
    with PostgresReader(url) as opened:
        yield opened


def write(url: str, exchanges: list[Exchange]) -> None:
    writer = postgres_writer(url)
    for ex in exchanges:
        writer.submit(ex)
    writer.close()
    assert not writer.stats.failures, writer.stats.last_error


def ids(tail: PostgresTail) -> list[str]:
    return [row["id"] for row in tail.poll()]


def test_a_transaction_committed_late_is_shown_once_and_a_replaced_row_comes_again(
    url: str, reader: PostgresReader
) -> None:
    tail = PostgresTail(reader, latest(reader), CaptureFilter())
    early, late = exchange(), exchange()
    with psycopg.connect(url) as slow:  # another instance's batch, begun first and committed last
        slow.execute("insert into exchanges (id, ts, started_at) values (%s, %s, now())", (early.id, early.started_at))
        write(url, [late])
        assert ids(tail) == []  # `late` waits behind the open transaction: showing it now would lose `early`
    assert ids(tail) == [early.id, late.id]
    assert ids(tail) == []
    by_seq = [r["id"] for r in reader.rows("select id from exchanges order by commit_seq")]
    assert by_seq == [early.id, late.id]  # drawn at insert: `late`'s is larger, yet it committed first
    write(url, [early])  # the writer replaces the row: committed again, after `late`
    assert ids(tail) == [early.id]
    again = PostgresTail(reader, (0, 0), CaptureFilter())
    assert ids(again) == [late.id, early.id]


def test_a_filter_takes_attempts_with_their_client_request(url: str, reader: PostgresReader) -> None:
    *attempts, parent = regenerated(attempts=2)
    other = exchange(flags={"runaway_length"})
    write(url, [parent, *attempts, other])
    follow = [parent.id, *(a.id for a in attempts)]
    assert ids(PostgresTail(reader, (0, 0), CaptureFilter(flag="regenerated"))) == follow
    assert ids(PostgresTail(reader, (0, 0), CaptureFilter(flag="runaway_length"))) == [other.id]
    assert ids(PostgresTail(reader, (0, 0), CaptureFilter(session="nobody"))) == []
    assert ids(PostgresTail(reader, (0, 0), CaptureFilter())) == [*follow, other.id]


def test_since_cursors(url: str, reader: PostgresReader) -> None:
    old = exchange(started_at=time.time() - 3600)  # arrived an hour ago; ended moments after
    first, second = exchange(), exchange()
    write(url, [old])
    write(url, [first])
    write(url, [second])
    assert ids(PostgresTail(reader, latest(reader), CaptureFilter())) == []
    assert ids(PostgresTail(reader, after_capture(reader, first.id), CaptureFilter())) == [second.id]
    assert ids(PostgresTail(reader, completed_within(reader, 600), CaptureFilter())) == [first.id, second.id]
    assert ids(PostgresTail(reader, completed_within(reader, 7200), CaptureFilter())) == [old.id, first.id, second.id]
