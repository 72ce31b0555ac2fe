"""Retention on PostgreSQL (store/pg/retention.py), on a real server: days before the cutoff's go as whole
partitions, the straddling day and the default partition lose only what is older than the cutoff, kept bodies
(delta bases included) rebuild byte-exact, sessions are recounted; `captures purge --db postgresql://` with
--vacuum and --max-size; the writer's own retention shows in its health."""

from __future__ import annotations

import datetime
import time
from typing import Any

import orjson
import psycopg
import pytest
from click.testing import CliRunner
from tapfix.proxy.cli.main import main
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.pg import retention
from tapfix.proxy.store.pg.writer import PostgresBackend, postgres_writer
from tapfix.proxy.store.retention import Retention
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.postgres import PostgresServer
from tests.support.sql_store import agent_session, write_all

pytestmark = [pytest.mark.postgres]
HOUR = 3600.0


def _at(day: datetime.date, hour: float) -> float:
    return datetime.datetime.combine(day, datetime.time(), datetime.UTC).timestamp() + hour * HOUR


def _bytes(pg: psycopg.Connection[Any], exchange_id: str) -> bytes | None:
    row = pg.execute("select tapfix_body_bytes(%s, 'request')", (exchange_id,)).fetchone()
    return None if row is None or row[0] is None else bytes(row[0])


def test_days_drop_whole_and_the_straddling_day_loses_only_its_older_rows(postgres: PostgresServer) -> None:
    url = postgres.create_database("retention_days")
    now = time.time()
    today = datetime.datetime.fromtimestamp(now, datetime.UTC).date()
    dropped, straddling, ancient = (today - datetime.timedelta(days=n) for n in (3, 2, 10))
    old = agent_session("old", 5, _at(dropped, 1), step=HOUR)
    old[-1].started_at = _at(straddling, 20)  # the session goes on past the cutoff
    straddle = agent_session("straddle", 8, _at(straddling, 1), step=HOUR)
    far = agent_session("ancient", 2, _at(ancient, 1))  # no partition for that day: the default partition's
    fresh = agent_session("fresh", 2, now - 60)
    write_all(postgres_writer(url), [*old, *straddle, *far, *fresh])
    with psycopg.connect(url, autocommit=True) as pg:
        for day in (dropped, straddling):
            pg.execute("select tapfix_add_day(%s)", (day,))  # moves their rows out of the default partition
        cutoff = _at(straddling, 4.5)
        report = retention.purge(pg, now - cutoff, now=now)
        assert report.days_dropped == [dropped.isoformat()]
        suffix = dropped.strftime("%Y%m%d")
        for table in retention.DAY_TABLES:
            assert pg.execute(f"select to_regclass('{table}_{suffix}')".encode()).fetchone() == (None,)
        kept = [old[-1], *straddle[4:], *fresh]
        remaining = {r[0] for r in pg.execute("select id from exchanges")}
        assert remaining == {ex.id for ex in kept}
        assert report.exchanges == 4 + 4 + 2 and report.sessions == 1  # the ancient session had nothing left
        for ex in kept:
            assert _bytes(pg, ex.id) == ex.request, ex.id
        # turn 5 of the straddling session is a delta on turn 4's body, and so on down: all kept as bases
        assert report.kept_bases >= 4 and report.bodies > 0
        assert pg.execute("select count(*) from bodies where day = %s", (ancient,)).fetchone() == (0,)
        sessions = dict(pg.execute("select id, exchanges from sessions").fetchall())
        assert sessions == {"old": 1, "straddle": 4, "fresh": 2}
        first = pg.execute("select extract(epoch from first_at) from sessions where id = 'old'").fetchone()
        assert first is not None and abs(float(first[0]) - old[-1].started_at) < 0.01
        assert report.bytes_after < report.bytes_before

    runner = CliRunner()
    assert runner.invoke(main, ["captures", "purge", "--db", url, "--max-age", "1d", "--dry-run"]).exit_code == 1
    again = runner.invoke(main, ["captures", "purge", "--db", url, "--max-age", f"{now - cutoff:.0f}s", "--vacuum"])
    assert again.exit_code == 0, again.output
    assert "purged 0 exchange(s)" in again.output and postgres.password not in again.output
    by_size = runner.invoke(main, ["captures", "purge", "--db", url, "--max-size", "1B", "--json"])
    assert by_size.exit_code == 0, by_size.output
    sized = orjson.loads(by_size.stdout)
    assert sized["days_dropped"] == [straddling.isoformat()] and sized["reasons"] == ["over 1 bytes"]
    with psycopg.connect(url, autocommit=True) as pg:  # today's day is never dropped for size
        assert {r[0] for r in pg.execute("select id from exchanges")} == {ex.id for ex in fresh}


def test_the_writer_runs_retention_on_postgresql_and_health_shows_it(postgres: PostgresServer) -> None:
    url = postgres.create_database("retention_writer")
    writer = CaptureWriter(PostgresBackend(url), retention=Retention(max_age_s=HOUR, every_s=0.1))
    stale: list[Exchange] = agent_session("stale", 2, time.time() - 3 * HOUR)
    try:
        for ex in [*stale, *agent_session("live", 1, time.time())]:
            writer.submit(ex)
        deadline = time.monotonic() + 10
        while writer.health()["retention"]["purged"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        health = writer.health()["retention"]
    finally:
        writer.close()
    assert health["purged"] == 2 and health["last_error"] is None and "days_dropped" in health
    with psycopg.connect(url, autocommit=True) as pg:
        assert pg.execute("select count(*) from exchanges").fetchone() == (1,)
