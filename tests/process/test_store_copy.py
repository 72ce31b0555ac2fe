"""`tapfix captures copy` (store/copy.py) on a real PostgreSQL: a store filled by SQLite's real writer goes to
PostgreSQL and back identical (rows, changes, choices, sessions, bodies by sha256), PostgreSQL's copy is laid out
as its own writer lays one out (deltas within a day, the same search text); a clash and a schema mismatch are
refused before anything is written; a copy killed half way is continued by `--resume`."""

from __future__ import annotations

import datetime
import hashlib
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from click.testing import CliRunner
from sqlite_utils import Database
from tapfix.proxy.cli.main import main
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.pg.schema import MIGRATIONS, REACHES
from tapfix.proxy.store.pg.writer import postgres_writer
from tapfix.proxy.store.sqlite.copy import SqliteSource
from tapfix.proxy.store.sqlite.schema import migrations
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.builders import chat_chunk, sse_events
from tests.support.postgres import PostgresServer
from tests.support.procs import TAPFIX
from tests.support.sql_store import agent_session, store_cases, write_all
from tests.unit.test_store_attempts import exchange, regenerated

pytestmark = [pytest.mark.postgres]
BODY_IDS = ("request_body_id", "forwarded_body_id", "response_body_id", "client_response_body_id")


def _cases() -> list[Exchange]:
    """Multi-turn sessions (one across UTC midnight), a changed request, a repaired answer, a binary body, one
    stored without bodies, regeneration attempts, n=2 choices, an upstream error, a redacted secret."""
    _, exchanges = store_cases(turns=30)
    midnight = datetime.datetime.combine(datetime.date.today(), datetime.time(), datetime.UTC).timestamp()
    late = agent_session("ses_midnight", 6, midnight - 12, step=5)  # three turns each side of midnight
    two = exchange(request=b'{"model":"m","n":2,"stream":true,"messages":[]}')
    two.response_chunks = sse_events(
        [chat_chunk({"content": "one"}, index=0), chat_chunk({"content": "two"}, index=1)]
        + [chat_chunk(finish_reason="stop", index=0), chat_chunk(finish_reason="length", index=1)]
    )
    failed = exchange(status=500, stream=False, content_type="application/json", response_chunks=[])
    failed.response = b'{"error":{"message":"engine overloaded","type":"server_error"}}'
    secret = exchange(request_headers=[("authorization", "Bearer sk-very-secret"), ("x-session-id", "ses_secret")])
    return [*exchanges, *late, *regenerated(attempts=2), two, failed, secret]


def _dump(path: Path) -> dict[str, Any]:
    """Everything a SQLite store holds, body ids replaced by their bodies' sha256."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in conn.execute("select * from exchanges order by id")]
        changes = [tuple(r)[1:] for r in conn.execute("select * from changes order by exchange_id, seq")]
        choices = [tuple(r) for r in conn.execute('select * from choices order by exchange_id, "index"')]
        sessions = [tuple(r) for r in conn.execute("select * from sessions order by id")]
    finally:
        conn.close()
    source = SqliteSource(path)
    try:
        keys = [(r["id"], r["started_at"]) for r in rows]
        digests = {
            c.row["id"]: [None if b is None else hashlib.sha256(b).hexdigest() for b in c.bodies.values()]
            for c in source.captures(keys)
        }
    finally:
        source.close()
    for row in rows:
        for column in BODY_IDS:
            row.pop(column)
    return {"rows": rows, "changes": changes, "choices": choices, "sessions": sessions, "bodies": digests}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Exchange]]:
    """The cases in a SQLite store, and the exchanges themselves (to write them to PostgreSQL's writer too)."""
    path = tmp_path_factory.mktemp("copy") / "a.db"
    exchanges = _cases()
    write_all(CaptureWriter(path), exchanges)
    return path, exchanges


@pytest.fixture
def source(written: tuple[Path, list[Exchange]]) -> Path:
    return written[0]


def _copy(*args: str) -> Any:
    return CliRunner().invoke(main, ["captures", "copy", *args])


def test_sqlite_to_postgresql_and_back_is_identical(
    written: tuple[Path, list[Exchange]], postgres: PostgresServer, tmp_path: Path
) -> None:
    source, exchanges = written
    url = postgres.create_database("copy_round_trip")
    there = _copy("--from", str(source), "--to", url, "--batch", "7")
    assert there.exit_code == 0, there.output
    assert "copied 7/" in there.stderr and "(100%)" in there.stderr and "checked" in there.stderr
    assert postgres.password not in there.output
    back = _copy("--from", url, "--to", str(tmp_path / "b.db"), "--json")
    assert back.exit_code == 0, back.output
    report = orjson.loads(back.stdout)
    mine, theirs = _dump(source), _dump(tmp_path / "b.db")
    assert report["copied"] == report["checked"] == len(mine["rows"])
    assert theirs == mine
    assert any(len(c) for c in mine["choices"]) and any(r["attempt_of"] for r in mine["rows"])
    headers = [r["request_headers"] for r in mine["rows"]]
    assert any("authorization" in h for h in headers) and not any("sk-very-secret" in h for h in headers)
    assert {r["status"] for r in mine["rows"]} >= {200, 500}
    with psycopg.connect(url, autocommit=True) as pg:
        crossing = pg.execute("select count(*) from bodies b join bodies a on a.id = b.base_id where a.day <> b.day")
        assert crossing.fetchone() == (0,)
        deltas = pg.execute("select count(*) from bodies where base_id is not null").fetchone()
        assert deltas is not None and deltas[0] >= 30  # the sessions' turns are deltas in the target too
        days = pg.execute("select count(*) from pg_tables where tablename ~ '^exchanges_[0-9]{8}$'").fetchone()
        assert days is not None and days[0] >= 2
        copied_search = dict(pg.execute("select id, search_text from exchanges").fetchall())
    # The search columns as PostgreSQL's own writer fills them, for the same exchanges.
    direct = postgres.create_database("copy_direct")
    write_all(postgres_writer(direct), exchanges)
    with psycopg.connect(direct, autocommit=True) as pg:
        written_search = dict(pg.execute("select id, search_text from exchanges").fetchall())
    assert copied_search == written_search and any(copied_search.values())


def test_a_clash_is_refused_naming_the_first_and_nothing_is_written(source: Path, tmp_path: Path) -> None:
    target = tmp_path / "t.db"
    first = SqliteSource(source)
    try:
        keys = first.keys(None, 3)
    finally:
        first.close()
    write_all(CaptureWriter(target), [exchange(id=keys[1][0]), exchange(id="zzzz-not-in-source")])
    before = _dump(target)
    refused = _copy("--from", str(source), "--to", str(target))
    assert refused.exit_code == 1
    assert f"already has capture {keys[1][0]}" in refused.output and "Traceback" not in refused.output
    assert _dump(target) == before


def test_schema_versions_must_match(source: Path, tmp_path: Path, postgres: PostgresServer) -> None:
    assert set(REACHES) == {name for name, _ in MIGRATIONS}  # every PostgreSQL migration says what it reaches
    older = tmp_path / "old.db"
    migrations.apply(Database(older), stop_before="m006_exchange_bodies")
    url = postgres.create_database("copy_mismatch")
    refused = _copy("--from", str(older), "--to", url)
    assert refused.exit_code == 1
    latest = REACHES[MIGRATIONS[-1][0]]  # this tapfix's schema, named by its last SQLite migration
    assert "m005_trace_context" in refused.output and latest in refused.output
    with psycopg.connect(url, autocommit=True) as pg:  # refused before the target was touched
        assert pg.execute("select to_regclass('tapfix_migrations')").fetchone() == (None,)


def test_a_killed_copy_is_refused_then_continued_by_resume(tmp_path: Path, postgres: PostgresServer) -> None:
    path = tmp_path / "many.db"
    write_all(CaptureWriter(path), [ex for k in range(40) for ex in agent_session(f"s{k}", 8, time.time() - 3600)])
    url = postgres.create_database("copy_resume")
    argv = [*TAPFIX, "captures", "copy", "--from", str(path), "--to", url, "--batch", "2"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("copied "), line
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    with psycopg.connect(url, autocommit=True) as pg:
        row = pg.execute("select count(*) from exchanges").fetchone()
        part = row[0] if row else 0
    assert 0 < part < 320
    assert _copy("--from", str(path), "--to", url).exit_code == 1  # a clash, without --resume
    resumed = _copy("--from", str(path), "--to", url, "--resume", "--json")
    assert resumed.exit_code == 0, resumed.output
    report = orjson.loads(resumed.stdout)
    assert report["skipped"] == part and report["copied"] == 320 - part and report["checked"] == 320
    back = tmp_path / "back.db"
    assert _copy("--from", url, "--to", str(back)).exit_code == 0
    assert _dump(back) == _dump(path)
