"""The PostgreSQL writer's batch in pipeline mode (store/pg/writer.py) and its one-statement body put
(store/pg/body_writer.py: ids from the sequence, nothing read back, the batch's bodies checked
before its commit), on a real server: an error of one exchange's statement surfaces in its own
batch (the others stored, the writer going on); a delta whose base a purge removed meanwhile, and a
body another instance stored first, make the batch be written again with look-ups, nothing lost."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.pg.writer import postgres_writer

from tests.support.postgres import PostgresServer
from tests.support.sql_store import agent_session

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def pg_url(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    return postgres.create_database(request.node.name.split("[")[0][-40:].lower())


@pytest.fixture
def pg(pg_url: str) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def _turn(session: str, k: int) -> Exchange:
    return agent_session(session, k + 1)[k]


def _wait(writer: Any, n: int) -> None:
    deadline = time.monotonic() + 20
    while writer.stats.written + writer.stats.failures < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_statement_that_fails_in_the_pipeline_fails_its_exchange_alone(pg_url: str, pg: Any) -> None:
    writer = postgres_writer(pg_url)
    turns = [_turn("a", k) for k in range(4)]
    turns[1].status = 2**40  # the server refuses it (integer out of range), after the statement was sent
    for ex in turns[:3]:
        writer.submit(ex)
    _wait(writer, 3)
    writer.submit(turns[3])  # a batch after the failed one: the connection and its pipeline are fine again
    writer.close()
    assert writer.stats.failures == 1 and writer.stats.written == 3
    stored = [r[0] for r in pg.execute("select id from exchanges order by id")]
    assert stored == sorted(ex.id for ex in (turns[0], turns[2], turns[3]))
    for ex in (turns[0], turns[2], turns[3]):
        got = pg.execute("select tapfix_body_bytes(%s, 'request')", (ex.id,)).fetchone()
        assert bytes(got[0]) == ex.request


def test_a_delta_whose_base_was_purged_meanwhile_is_stored_whole(pg_url: str, pg: Any) -> None:
    writer = postgres_writer(pg_url)
    first, second = _turn("b", 0), _turn("b", 1)
    writer.submit(first)
    _wait(writer, 1)
    base = pg.execute("select request_body_id from exchanges where id = %s", (first.id,)).fetchone()[0]
    pg.execute("delete from exchanges where id = %s", (first.id,))  # what a purge of the first turn does
    pg.execute("delete from bodies where id = %s", (base,))
    writer.submit(second)
    writer.close()
    assert (writer.stats.failures, writer.stats.lock_retries) == (0, 1)  # the check saw it, the retry looked up
    row = pg.execute(
        "select b.base_id, b.depth, tapfix_body_bytes(e.id, 'request') from exchanges e"
        " join bodies b on b.id = e.request_body_id where e.id = %s",
        (second.id,),
    ).fetchone()
    assert row[0] is None and row[1] == 0 and bytes(row[2]) == second.request


def test_the_same_bytes_another_instance_stored_first_are_shared_not_lost(pg_url: str, pg: Any) -> None:
    first, second = postgres_writer(pg_url), postgres_writer(pg_url)
    mine, theirs = _turn("c", 2), _turn("c", 2)  # byte-identical requests, two exchanges
    first.submit(mine)
    first.close()
    second.submit(theirs)  # its insert meets the committed row: the check before the commit sees it
    second.close()
    assert (first.stats.failures, second.stats.failures, second.stats.lock_retries) == (0, 0, 1)
    rows = pg.execute(
        "select id, request_body_id, tapfix_body_bytes(id, 'request') from exchanges order by id"
    ).fetchall()
    assert [r[0] for r in rows] == sorted([mine.id, theirs.id])
    assert rows[0][1] == rows[1][1] and pg.execute("select count(*) from bodies").fetchone()[0] == 2
    assert all(bytes(r[2]) == mine.request for r in rows)
