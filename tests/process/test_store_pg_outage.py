"""The writer across a PostgreSQL outage, on the suite's second server (`postgres_to_restart`, stopped
and started here, so the session's server is never disturbed): exchanges held in memory while it is
down and written in order once it is back, none twice; beyond the hold's bound the oldest counted lost
(`queue_full`); a close while it is down; a start with the server down, migrated when it comes up; a
commit whose answer was lost not written twice; and `tapfix check --db` on both backends (reachable or
not, schema up to date, behind or ahead)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from tapfix.proxy.cli.main import main
from tapfix.proxy.store.pg.writer import PostgresBackend, postgres_writer
from tapfix.proxy.store.retention import Retention
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.postgres import PostgresServer
from tests.support.sql_store import agent_session

pytestmark = [pytest.mark.postgres]


@pytest.fixture(scope="module")
def server(postgres_to_restart: PostgresServer) -> PostgresServer:
    return postgres_to_restart  # stopped and started here: not the session's `postgres`


@pytest.fixture
def url(server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    yield server.create_database(request.node.name[-40:].lower())
    if not (server.data / "postmaster.pid").exists():  # a test that failed while the server was down
        server.up()


def _until(done: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _watched(writer: CaptureWriter) -> list[tuple[str, str]]:
    told: list[tuple[str, str]] = []
    writer.observers.append(lambda w: told.append((w.exchange.id, w.outcome)))
    return told


def _rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(sql.encode()).fetchall()]


def test_an_outage_holds_exchanges_and_writes_them_in_order_once_back(server: PostgresServer, url: str) -> None:
    writer = postgres_writer(url)
    told = _watched(writer)
    turns = agent_session("outage", 12, time.time() - 30, header=False)  # sessions by conversation: order matters
    for ex in turns[:3]:
        writer.submit(ex)
    _until(lambda: writer.stats.written == 3)
    server.down()
    for ex in turns[3:]:
        writer.submit(ex)  # never blocks, never raises
    _until(lambda: writer.health()["store"]["held"] == 9)
    store = writer.health()["store"]
    assert store["state"] == "unavailable" and store["since"] and store["held_bytes"] > 9 * 1000
    assert server.password not in str(writer.health())
    server.up()
    _until(lambda: writer.stats.written == 12)
    writer.close()
    health = writer.health()
    assert health["store"]["state"] == "ok" and health["store"]["held"] == 0 and health["failures"] == 0
    assert told == [(ex.id, "stored") for ex in turns]
    rows = _rows(url, "select id, session_id from exchanges order by request_body_id")
    assert [r[0] for r in rows] == [ex.id for ex in turns]  # written in order, each once
    assert len({r[1] for r in rows}) == 1 and _rows(url, "select exchanges from sessions") == [(12,)]


def test_beyond_the_bound_the_oldest_held_are_lost_as_queue_full(server: PostgresServer, url: str) -> None:
    writer = postgres_writer(url, max_held=4)
    told = _watched(writer)
    server.down()
    turns = agent_session("full", 7, time.time(), header=True)
    for ex in turns:
        writer.submit(ex)
    _until(lambda: writer.stats.failures == 3)
    health = writer.health()
    assert health["failures_by_cause"] == {"queue_full": 3} and health["store"]["held"] == 4
    assert health["store"]["max_held"] == 4 and "queue is full" in str(health["last_error"])
    server.up()
    _until(lambda: writer.stats.written == 4)
    writer.close()
    assert told == [(ex.id, "lost") for ex in turns[:3]] + [(ex.id, "stored") for ex in turns[3:]]
    assert sorted(r[0] for r in _rows(url, "select id from exchanges")) == sorted(ex.id for ex in turns[3:])


def test_the_bytes_bound_is_the_one_named_when_it_drops(server: PostgresServer, url: str, caplog) -> None:
    """Issue 31 item 3: 3 of 4 captures lost to `--store-queue-bytes`, and the log blamed the 10,000-exchange
    bound. What is said (log, health) names the bound that was hit."""
    turns = agent_session("bytes", 4, time.time(), header=True)
    largest = max(len(ex.request) for ex in turns)
    writer = postgres_writer(url, max_held_bytes=largest + 1)  # one exchange fits, two don't
    server.down()
    for ex in turns:
        writer.submit(ex)
    _until(lambda: writer.stats.failures == 3)
    health = writer.health()
    assert health["failures_by_cause"] == {"queue_full": 3} and health["store"]["held"] == 1
    said = str(health["last_error"]) + caplog.text
    assert "--store-queue-bytes" in said and "10000 exchanges" not in said, said
    server.up()
    _until(lambda: writer.stats.written == 1)
    writer.close()


def test_a_close_while_the_server_is_down_counts_what_is_held_as_lost(server: PostgresServer, url: str) -> None:
    writer = postgres_writer(url)
    told = _watched(writer)
    server.down()
    turns = agent_session("closing", 2, time.time())
    for ex in turns:
        writer.submit(ex)
    began = time.monotonic()
    writer.close(timeout=2.5)  # half a second of retries, then given up
    assert time.monotonic() - began < 2.5
    assert writer.health()["failures_by_cause"] == {"unavailable": 2}
    assert told == [(ex.id, "lost") for ex in turns]


def test_a_start_with_the_server_down_serves_then_migrates_when_it_is_up(server: PostgresServer, url: str) -> None:
    server.down()
    with pytest.raises(Exception, match=r"can't connect.*\*\*\*|can't connect"):
        PostgresBackend(url)  # without `wait` (`run --strict`): a one-line StoreError
    retention = Retention(max_age_s=7 * 86400, every_s=0.05)  # idle while starting: no purge, no crash
    writer = postgres_writer(url, wait=True, retention=retention)
    assert writer.health()["store"]["state"] == "starting"
    time.sleep(0.2)  # idle: retention is due, and waits for the database
    ex = agent_session("early", 1, time.time())[0]
    writer.submit(ex)
    _until(lambda: writer.health()["store"]["retries"] >= 1)
    assert writer.health()["store"]["state"] == "starting" and writer.health()["store"]["held"] == 1
    server.up()
    _until(lambda: writer.stats.written == 1)
    writer.close()
    assert _rows(url, "select id from exchanges") == [(ex.id,)]
    assert len(_rows(url, "select name from tapfix_migrations")) >= 1 and retention.runs >= 1
    days = _rows(url, "select count(*) from pg_tables where tablename like 'exchanges_2%'")
    assert days == [(2,)]  # today's and tomorrow's partitions, made on the first connection


class _LostAnswer(PostgresBackend):
    """Commits, then loses the connection before the answer arrives: the writer can't know it committed."""

    cut = 1

    def commit(self) -> None:
        super().commit()
        if self.cut:
            self.cut -= 1
            with psycopg.connect(self.locator.url, autocommit=True) as other:
                other.execute("select pg_terminate_backend(%s)", (self.conn.info.backend_pid,))
            self.conn.execute("select 1")  # raises: the connection is gone


def test_a_commit_whose_answer_was_lost_is_not_written_twice(url: str) -> None:
    writer = CaptureWriter(_LostAnswer(url))
    told = _watched(writer)
    turns = agent_session("unsure", 3, time.time() - 5, header=True)
    for ex in turns:
        writer.submit(ex)
    _until(lambda: writer.stats.written == 3)
    writer.close()
    assert told == [(ex.id, "stored") for ex in turns]
    assert _rows(url, "select exchanges from sessions") == [(3,)]  # each counted once in its session
    assert len(_rows(url, "select id from exchanges")) == 3


def _check(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["check", *args])
    return result.exit_code, result.output


def test_check_db_reports_reachability_and_schema_on_both_backends(
    server: PostgresServer, url: str, tmp_path: Path
) -> None:
    lite = tmp_path / "c.db"
    code, out = _check("--db", str(lite))
    assert code == 0 and out.startswith(f"store    ok   {lite}  no file yet") and "schema behind (0 of " in out
    CaptureWriter(lite).close()
    code, out = _check("--db", str(lite))
    assert code == 0 and "SQLite file; schema up to date" in out
    with sqlite3.connect(lite) as conn:
        conn.execute(
            "insert into _sqlite_migrations (migration_set, name, applied_at) values ('tapfix', 'm999_future', '')"
        )
    code, out = _check("--db", str(lite))
    assert code == 1 and "FAIL" in out and "ahead: migration m999_future" in out

    postgres_writer(url).close()
    code, out = _check("--db", url)
    assert code == 0 and "PostgreSQL" in out and "schema up to date" in out and ":***@" in out
    with psycopg.connect(url, autocommit=True) as conn:
        last = conn.execute("select name from tapfix_migrations order by applied_order desc limit 1").fetchone()
        assert last is not None
        conn.execute("delete from tapfix_migrations where name = %s", (last[0],))
    code, out = _check("--db", url)
    assert code == 0 and "behind" in out and last[0] in out
    server.down()
    code, out = _check("--db", url, "--timeout", "1")
    assert code == 1 and "unreachable" in out and server.password not in out and len(out.splitlines()) == 1
    code, out = _check()
    assert code == 2 and "give --config FILE, --db LOCATOR, or both" in out
