"""The capture writer on PostgreSQL (store/pg/writer.py), on a real server (tests/support/postgres.py):
bodies byte-exact through the PL/pgSQL `tapfix_body_bytes` and stored as the same deltas SQLite's writer
makes; two instances on one database losing, duplicating and cross-basing nothing; a session's first
body of a new UTC day stored whole; text with NUL stored, the body exact."""

from __future__ import annotations

import datetime
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.bodies import BODY_KINDS
from tapfix.proxy.store.pg.locator import PostgresLocator
from tapfix.proxy.store.pg.writer import NUL_STANDS_FOR, PostgresBackend, postgres_writer
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.postgres import PostgresServer
from tests.support.sql_store import agent_session, store_cases, write_all

pytestmark = [pytest.mark.postgres]

PGConn = psycopg.Connection[tuple[Any, ...]]
# Columns the two writers must fill alike (body ids differ: each store numbers its own).
SAME = (
    "id, ts, model, status, stream, session_id, thread_id, chain_hash, flags, tags, content, finish_reason,"
    " changes_count,"
    " request_size, response_size, request_headers, response_headers, prompt_tokens, chunk_count, chunk_timing,"
    " attempt, error"
)
_BODY = "select size, prefix_len, suffix_len, depth, base_id is null, sha256, encoding, data from bodies where id = {}"


@pytest.fixture
def pg_url(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    return postgres.create_database(request.node.name.split("[")[0][-40:].lower())


@pytest.fixture
def pg(pg_url: str) -> Iterator[PGConn]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


def _body_bytes(pg: PGConn, exchange_id: str, kind: str) -> bytes | None:
    row = pg.execute("select tapfix_body_bytes(%s, %s)", (exchange_id, kind)).fetchone()
    return None if row is None or row[0] is None else bytes(row[0])


def test_bodies_and_rows_match_sqlites_writer_byte_for_byte(tmp_path: Path, pg_url: str, pg: PGConn) -> None:
    filled, exchanges = store_cases(seed=11)
    nul = Exchange(method="POST", path="/v1/chat/completions", model="m", request=b'{"model":"m","messages":[]}')
    nul.status, nul.content_type = 200, "application/json"
    nul.response = (
        b'{"choices":[{"index":0,"message":{"role":"assistant","content":"a\\u0000b"},"finish_reason":"stop"}]}'
    )
    two = Exchange(method="POST", path="/v1/chat/completions", model="m", request=b'{"model":"m","n":2,"messages":[]}')
    two.status, two.content_type = 200, "application/json"
    two.response = orjson.dumps(
        {"choices": [{"index": i, "message": {"role": "assistant", "content": t}} for i, t in enumerate(("x", ""))]}
    )
    write_all(CaptureWriter(tmp_path / "s.db"), [*exchanges, nul, two])
    write_all(postgres_writer(pg_url), [*exchanges, nul, two])
    lite = sqlite3.connect(tmp_path / "s.db")
    for ex in exchanges:
        for kind in BODY_KINDS:
            expected = None if not ex.store_bodies else filled.bodies[ex.id][kind]
            assert _body_bytes(pg, ex.id, kind) == expected, (ex.id, kind)
    # The same rows, and the same deltas: sizes, prefix/suffix, depth, roots; raw middles == SQLite's inflated.
    lite_rows = lite.execute(f"select {SAME} from exchanges order by id").fetchall()
    pg_rows = pg.execute(f"select {SAME} from exchanges order by id").fetchall()
    assert len(pg_rows) == len(exchanges) + 2
    for a, b in zip(lite_rows, pg_rows, strict=True):
        b = tuple(bytes(v) if isinstance(v, memoryview) else v for v in b)
        assert a == b or (a[0] == nul.id and a[10] == "a\x00b" and b[10] == f"a{NUL_STANDS_FOR}b")
    assert _body_bytes(pg, nul.id, "response") == nul.response  # the body keeps its exact bytes
    for ex_id in filled.session:
        (lite_id,) = lite.execute("select request_body_id from exchanges where id = ?", (ex_id,)).fetchone()
        pg_row = pg.execute("select request_body_id from exchanges where id = %s", (ex_id,)).fetchone()
        assert pg_row is not None
        mine = lite.execute(_BODY.format(lite_id)).fetchone()
        theirs = pg.execute(_BODY.format(pg_row[0])).fetchone()
        assert theirs is not None and theirs[:6] == tuple(mine[:6]) and theirs[6] == "raw"
        assert bytes(theirs[7]) == (zlib.decompress(mine[7]) if mine[6] == "zlib" else mine[7])
    threads = lite.execute("select thread_id, count(*) from exchanges where session_id = 'ses_sql_test' group by 1")
    assert [n for _, n in threads.fetchall()] == [len(filled.session)], "one chain: one thread, on both backends"
    assert lite.execute("select id, exchanges from sessions").fetchall() == [
        tuple(r) for r in pg.execute("select id, exchanges from sessions").fetchall()
    ]
    choices = 'select exchange_id, "index", content, flags from choices order by 1, 2'
    assert lite.execute(choices).fetchall() == [tuple(r) for r in pg.execute(choices).fetchall()]
    assert len(lite.execute(choices).fetchall()) == 2
    assert lite.execute("select exchange_id, stage, after from changes").fetchall() == [
        tuple(r) for r in pg.execute("select exchange_id, stage, after from changes").fetchall()
    ]
    # Search: the turn's new text and the answer, words and substrings.
    last = filled.session[-1]
    found = pg.execute(
        "select id from exchanges where search @@ to_tsquery('simple', 'answer') and search_text like %s",
        (f"%turn {len(filled.session) - 1}:%",),
    ).fetchall()
    assert [r[0] for r in found] == [last]


def _wait_written(writers: list[CaptureWriter], total: int) -> None:
    deadline = time.monotonic() + 10
    while sum(w.stats.written + w.stats.failures for w in writers) < total and time.monotonic() < deadline:
        time.sleep(0.02)


def test_two_instances_interleave_sessions_losing_and_crossing_nothing(pg_url: str, pg: PGConn) -> None:
    """Turn k of a session goes to one instance, turn k+1 to the other: the sessions are found across
    them (no x-session-id: by conversation), and every delta's base is one its own instance wrote."""
    start = time.time() - 60
    sessions = [agent_session(f"s{i}", 8, start + i * 0.01, header=i % 2 == 0) for i in range(6)]
    writers = [postgres_writer(pg_url), postgres_writer(pg_url)]
    submitted = 0
    for k in range(8):
        for i, turns in enumerate(sessions):
            writers[(i + k) % 2].submit(turns[k])
            submitted += 1
        _wait_written(writers, submitted)  # the next turn follows the answer, as an agent's does
    for w in writers:
        w.close()
        assert w.stats.failures == 0
    rows = pg.execute("select id, session_id, request_body_id from exchanges").fetchall()
    ids = [r[0] for r in rows]
    assert sorted(ids) == sorted(ex.id for turns in sessions for ex in turns) and len(set(ids)) == len(ids)
    by_id = {r[0]: r for r in rows}
    for turns in sessions:
        assert len({by_id[ex.id][1] for ex in turns}) == 1, "one agent run is one session"
    counts = dict(pg.execute("select id, exchanges from sessions").fetchall())
    assert sorted(counts.values()) == [8] * 6
    own = [set(w.bodies._own) for w in writers]  # type: ignore[attr-defined]
    deltas = pg.execute("select id, base_id from bodies where base_id is not null").fetchall()
    assert len(deltas) >= 6 * 8 // 2
    for body_id, base_id in deltas:
        assert any(body_id in mine and base_id in mine for mine in own), (body_id, base_id)
    # The same first turn reaching both (two identical runs): the second instance's dedupe finds the
    # first's body, and its next turn is stored whole rather than as a delta on a body not its own.
    twin_a, twin_b = agent_session("twin", 1, start), agent_session("twin", 2, start)
    again = [postgres_writer(pg_url), postgres_writer(pg_url)]
    write_all(again[0], twin_a)
    write_all(again[1], twin_b)
    ids = [
        r[0]
        for r in pg.execute(
            "select request_body_id from exchanges where id = any(%s) order by started_at, id",
            ([twin_a[0].id, twin_b[0].id, twin_b[1].id],),
        ).fetchall()
    ]
    assert ids[0] == ids[1]  # one row for the same bytes on the same day
    second = pg.execute("select base_id, depth from bodies where id = %s", (ids[2],)).fetchone()
    assert second == (None, 0)
    for ex_id, kind in ((ex.id, "request") for turns in sessions for ex in turns):
        assert _body_bytes(pg, ex_id, kind) == next(e.request for t in sessions for e in t if e.id == ex_id)


def test_a_sessions_first_body_of_a_new_utc_day_is_stored_whole(pg_url: str, pg: PGConn) -> None:
    day = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
    turns = agent_session("midnight", 5, day.timestamp() - 2.5)  # 23:59:57.5, :58.5, :59.5, then 00:00:00.5, 01.5
    writer = postgres_writer(pg_url)  # migrates
    pg.execute("select tapfix_add_day(%s)", (day.date() - datetime.timedelta(days=1),))  # the 1st: default
    write_all(writer, turns)
    rows = pg.execute(
        "select e.id, b.day, b.base_id is null, b.depth, e.tableoid::regclass::text, b.tableoid::regclass::text"
        " from exchanges e join bodies b on b.id = e.request_body_id order by e.started_at"
    ).fetchall()
    assert [r[0] for r in rows] == [ex.id for ex in turns]
    before, after = datetime.date(2026, 2, 28), datetime.date(2026, 3, 1)
    assert [(r[1], r[2], r[3]) for r in rows] == [
        (before, True, 0),
        (before, False, 1),
        (before, False, 2),
        (after, True, 0),  # the new day's first body: whole, never a delta on yesterday's
        (after, False, 1),
    ]
    assert [r[4] for r in rows] == ["exchanges_20260228"] * 3 + ["exchanges_default"] * 2
    assert [r[5] for r in rows] == ["bodies_20260228"] * 3 + ["bodies_default"] * 2
    for ex in turns:
        assert _body_bytes(pg, ex.id, "request") == ex.request


def test_a_backend_that_cant_connect_names_the_store_without_its_password(postgres: PostgresServer) -> None:
    url = postgres.dsn("no_such_database")
    from tapfix.proxy.store.errors import StoreError

    with pytest.raises(StoreError) as caught:
        PostgresBackend(url)
    assert postgres.password not in str(caught.value) and "***" in str(caught.value)


def _cut_writers(pg: PGConn) -> int:
    """End the writers' server connections, as a restart or a network cut would; how many."""
    rows = pg.execute(
        "select pg_terminate_backend(pid) from pg_stat_activity"
        " where application_name = 'tapfix writer' and datname = current_database()"
    ).fetchall()
    return len(rows)


def test_a_cut_connection_is_taken_again_and_an_unreachable_server_holds_exchanges(
    postgres: PostgresServer, pg_url: str, pg: PGConn
) -> None:
    writer = postgres_writer(pg_url)
    backend = writer.backend
    assert isinstance(backend, PostgresBackend)
    first, second, third = (agent_session(name, 1, time.time(), header=False)[0] for name in ("a", "b", "c"))
    assert _cut_writers(pg) == 1
    writer.submit(first)  # the connection is found broken, taken again, the batch retried on it
    _wait_written([writer], 1)
    assert writer.stats.written == 1 and writer.health()["store"]["state"] == "ok"
    real = backend.locator
    backend.locator = PostgresLocator.parse(pg_url.replace(f"127.0.0.1:{postgres.port}", "127.0.0.1:1"))
    assert _cut_writers(pg) == 1
    writer.submit(second)  # the server can't be reached: held, traffic unaffected
    deadline = time.monotonic() + 10
    while writer.health()["store"]["retries"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    health = writer.health()
    assert health["failures"] == 0 and health["store"]["state"] == "unavailable" and health["store"]["held"] == 1
    assert postgres.password not in str(health)
    backend.locator = real
    writer.submit(third)  # back: both stored, in order
    writer.close()
    stored = [r[0] for r in pg.execute("select id from exchanges order by request_body_id").fetchall()]
    assert stored == [first.id, second.id, third.id] and writer.stats.failures == 0


def _responses(request: dict[str, Any], response_id: str) -> Exchange:
    ex = Exchange(method="POST", path="/v1/responses", model="m", request=orjson.dumps(request))
    ex.status, ex.content_type = 200, "application/json"
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}
    ex.response = orjson.dumps({"id": response_id, "object": "response", "status": "completed", "output": [message]})
    return ex


def test_sessions_join_across_instances_whichever_writes_first(pg_url: str, pg: PGConn) -> None:
    """A later turn written (by another instance) before the turn it continues starts a session that
    wants its parent; the parent, once written, takes it in. `previous_response_id` joins across too."""
    first, second, third = agent_session("late", 3, time.time() - 10, header=False)
    opening = _responses({"model": "m", "input": "hi"}, "resp_pg_1")
    follow = _responses({"model": "m", "input": "more", "previous_response_id": "resp_pg_1"}, "resp_pg_2")
    a, b = postgres_writer(pg_url), postgres_writer(pg_url)
    for writer, ex in ((b, second), (a, first), (b, third), (a, opening), (b, follow)):
        writer.submit(ex)  # each is committed before the next is sent
        deadline = time.monotonic() + 10
        while not pg.execute("select 1 from exchanges where id = %s", (ex.id,)).fetchone():
            assert time.monotonic() < deadline
            time.sleep(0.02)
    a.close()
    b.close()
    sessions = dict(pg.execute("select id, session_id from exchanges").fetchall())
    assert sessions[first.id] == sessions[second.id] == sessions[third.id] is not None
    assert sessions[opening.id] == sessions[follow.id] is not None != sessions[first.id]
    counts = pg.execute("select exchanges, first_at, last_at, wants from sessions order by first_at").fetchall()
    assert [(c[0], c[3]) for c in counts] == [(3, None), (2, None)]
    assert abs(counts[0][1].timestamp() - first.started_at) < 0.001  # timestamptz, to the millisecond
    assert abs(counts[0][2].timestamp() - third.started_at) < 0.001


class _SlowCommit(PostgresBackend):
    """Holds its transaction open until told to commit: another instance writes in the meantime."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.entered, self.go = threading.Event(), threading.Event()

    def commit(self) -> None:
        self.entered.set()
        self.go.wait(10)
        super().commit()


def test_a_turn_and_its_continuation_written_at_once_by_two_instances_are_one_session(pg_url: str, pg: PGConn) -> None:
    """Without the fleet's write lock each transaction misses the other's uncommitted row: two sessions."""
    first, second = agent_session("race", 2, time.time() - 5, header=False)
    slow = _SlowCommit(pg_url)
    a, b = CaptureWriter(slow), postgres_writer(pg_url)
    a.submit(first)
    assert slow.entered.wait(10)  # the parent's transaction is open, not committed
    b.submit(second)
    time.sleep(0.3)  # the continuation's transaction runs now (or waits for the parent's)
    slow.go.set()
    a.close()
    b.close()
    sessions = dict(pg.execute("select id, session_id from exchanges").fetchall())
    assert sessions[first.id] == sessions[second.id] is not None
    assert [r[0] for r in pg.execute("select exchanges from sessions").fetchall()] == [2]
