"""Retention: purging by age or size never breaks a kept body (delta bases stay while anything needs them).

The property: write random agent sessions (each turn resends the conversation, so bodies become delta
chains), purge at a random cutoff or size, then every kept exchange's four bodies rebuild byte for byte,
no body is left that nothing needs, and the purge is idempotent.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.cli.purge import purge as purge_command
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.quantities import parse_duration, parse_size
from tapfix.proxy.store.retention import Retention
from tapfix.proxy.store.sqlite.bodies import read_body
from tapfix.proxy.store.sqlite.database import open_for_writing
from tapfix.proxy.store.sqlite.retention import BODY_COLUMNS, purge, used_bytes
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.builders import sse_event
from tests.support.depth import examples


def _session_exchanges(sessions: int, turns: int, seed: int, t0: float) -> list[Exchange]:
    """Agent-like traffic: per session, each turn's body is the previous one plus a new message."""
    out: list[Exchange] = []
    for s in range(sessions):
        history = f'{{"model":"m","messages":[{{"role":"system","content":"{"sys " * (40 + seed % 7)}"}}'
        for t in range(turns):
            history += f',{{"role":"user","content":"turn {t} of session {s} seed {seed} {"x" * ((seed + t) % 50)}"}}'
            body = (history + "]}").encode()
            answer = sse_event({"choices": [{"index": 0, "delta": {"content": f"answer {s}.{t}"}}]})
            ex = Exchange(
                method="POST",
                path="/v1/chat/completions",
                request=body,
                model="m",
                status=200,
                content_type="text/event-stream",
                stream=True,
                response_chunks=[answer, b"data: [DONE]\n\n"],
                chunk_times=[0.01, 0.02],
                session_hint=f"sess-{seed}-{s}",
                request_headers=[("x-session-id", f"sess-{seed}-{s}")],
            )
            if t % 3 == 1:
                ex.forwarded = body[:-2] + b',"top_p":0.9}'
            if t % 4 == 2:
                ex.client_response = answer.replace(b"answer", b"ANSWER") + b"data: [DONE]\n\n"
            ex.started_at = t0 + s * 0.001 + t * 10.0  # turn t happens t*10 s after the session's start
            out.append(ex)
    return out


def _expected(ex: Exchange) -> dict[str, bytes | None]:
    upstream = ex.response_body()
    client = ex.client_response_body()
    return {
        "request_body_id": ex.request,
        "forwarded_body_id": ex.forwarded if ex.forwarded not in (None, ex.request) else None,
        "response_body_id": upstream,
        "client_response_body_id": client if client != upstream else None,
    }


def _write(path, exchanges: list[Exchange]) -> None:
    writer = CaptureWriter(path)
    for ex in exchanges:
        writer.submit(ex)
    writer.close()
    assert writer.health()["failures"] == 0


def _check_store(conn: sqlite3.Connection, by_id: dict[str, Exchange]) -> int:
    """Every kept exchange rebuilds exactly; every body left is needed. Returns the kept count."""
    kept = 0
    for row in conn.execute(f"select id, {', '.join(BODY_COLUMNS)} from exchanges"):
        want = _expected(by_id[row[0]])
        for column, body_id in zip(BODY_COLUMNS, row[1:], strict=True):
            assert read_body(conn, body_id) == want[column], (row[0], column)
        kept += 1
    needed = {
        r[0]
        for r in conn.execute(
            "with recursive n(id) as ("
            + " union ".join(f"select {c} from exchanges" for c in BODY_COLUMNS)
            + " union select b.base_id from bodies b join n on b.id = n.id) select id from n where id is not null"
        )
    }
    stored = {r[0] for r in conn.execute("select id from bodies")}
    assert stored == needed, "bodies left that nothing needs, or needed bodies missing"
    orphans = conn.execute("select count(*) from changes where exchange_id not in (select id from exchanges)")
    assert orphans.fetchone()[0] == 0
    return kept


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 4), st.integers(1, 9), st.integers(0, 10**6), st.integers(-1, 100))
def test_purge_by_age_keeps_every_kept_body_exact(tmp_path_factory, sessions, turns, seed, cut):
    path = tmp_path_factory.mktemp("ret") / "c.db"
    t0 = 1_700_000_000.0
    exchanges = _session_exchanges(sessions, turns, seed, t0)
    _write(path, exchanges)
    conn = open_for_writing(path)
    now = t0 + 1000.0
    older_than = now - (t0 + cut)  # delete exchanges that started before t0 + cut
    report = purge(conn, older_than_s=older_than, now=now, batch=3)
    expected_gone = sum(1 for ex in exchanges if ex.started_at < t0 + cut)
    assert report.exchanges == expected_gone
    kept = _check_store(conn, {ex.id: ex for ex in exchanges})
    assert kept == len(exchanges) - expected_gone
    again = purge(conn, older_than_s=older_than, now=now)
    assert (again.exchanges, again.bodies) == (0, 0)
    assert conn.execute("pragma integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_a_base_is_kept_while_a_later_turn_needs_it(tmp_path):
    """Purging turn 1 of a session keeps its body as the base of turn 2 (which is stored as a delta on it)."""
    path = tmp_path / "c.db"
    exchanges = _session_exchanges(1, 3, 7, 1_700_000_000.0)
    _write(path, exchanges)
    conn = open_for_writing(path)
    first_req = conn.execute("select request_body_id from exchanges where id = ?", (exchanges[0].id,)).fetchone()[0]
    dependants = conn.execute("select count(*) from bodies where base_id = ?", (first_req,)).fetchone()[0]
    assert dependants >= 1, "turn 2 should be a delta of turn 1 (the premise of this test)"
    report = purge(conn, older_than_s=5.0, now=exchanges[0].started_at + 6.0)
    assert report.exchanges == 1 and report.kept_bases >= 1
    assert conn.execute("select 1 from bodies where id = ?", (first_req,)).fetchone() is not None
    _check_store(conn, {ex.id: ex for ex in exchanges})
    purge(conn, older_than_s=0, now=time.time())  # everything: now the bases go too
    assert conn.execute("select count(*) from bodies").fetchone()[0] == 0
    assert conn.execute("select count(*) from sessions").fetchone()[0] == 0


def test_purge_to_a_size_cap(tmp_path):
    path = tmp_path / "c.db"
    exchanges = _session_exchanges(6, 6, 3, 1_700_000_000.0)
    for i, ex in enumerate(exchanges):  # incompressible, distinct bodies so the size is real
        ex.response_chunks = [os.urandom(6000), b"data: [DONE]\n\n"]
        ex.started_at += i * 0.0001
    _write(path, exchanges)
    conn = open_for_writing(path)
    before = used_bytes(conn)
    cap = before // 2
    report = purge(conn, max_bytes=cap)
    assert used_bytes(conn) <= cap and 0 < report.exchanges < len(exchanges)
    kept_ids = {r[0] for r in conn.execute("select id from exchanges")}
    oldest_kept = min(ex.started_at for ex in exchanges if ex.id in kept_ids)
    assert all(ex.started_at <= oldest_kept for ex in exchanges if ex.id not in kept_ids), "oldest go first"
    _check_store(conn, {ex.id: ex for ex in exchanges})


def test_cli_purge_and_vacuum(tmp_path):
    path = tmp_path / "c.db"
    exchanges = _session_exchanges(3, 4, 1, time.time() - 30 * 86400)
    fresh = _session_exchanges(1, 2, 2, time.time())
    for ex in exchanges:
        ex.response_chunks = [os.urandom(20000)]
    _write(path, exchanges + fresh)
    size_before = path.stat().st_size
    runner = CliRunner()
    result = runner.invoke(purge_command, ["--db", str(path), "--max-age", "7d", "--vacuum"])
    assert result.exit_code == 0, result.output
    assert "purged 12 exchange(s)" in result.output
    assert path.stat().st_size < size_before
    conn = open_for_writing(path)
    assert {r[0] for r in conn.execute("select id from exchanges")} == {ex.id for ex in fresh}
    _check_store(conn, {ex.id: ex for ex in exchanges + fresh})
    assert runner.invoke(purge_command, ["--db", str(path)]).exit_code == 2  # nothing asked
    bad = runner.invoke(purge_command, ["--db", str(path), "--max-age", "soon"])
    assert bad.exit_code == 2 and "not a duration" in bad.output


@pytest.mark.parametrize(
    ("text", "seconds"), [("7d", 7 * 86400), ("12h", 43200), ("30m", 1800), ("90", 90), ("1.5s", 1.5), ("2w", 1209600)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_parse_size():
    assert parse_size("500M") == 500 * 1024**2 and parse_size("2G") == 2 * 1024**3 and parse_size("100B") == 100
    assert parse_size("1.5GB") == int(1.5 * 1024**3)
    with pytest.raises(ValueError):
        parse_size("lots")


def test_retention_from_config():
    assert Retention.from_config({}) is None
    r = Retention.from_config({"max_age": "7d", "max_size": "1G", "check_every": "30s"})
    assert r is not None and (r.max_age_s, r.max_bytes, r.every_s) == (604800, 1024**3, 30)


def test_writer_enforces_retention_from_its_own_thread(tmp_path):
    path = tmp_path / "c.db"
    old = _session_exchanges(2, 3, 5, time.time() - 3600)
    writer = CaptureWriter(path, retention=Retention(max_age_s=600, every_s=0.2))  # type: ignore[call-arg]
    for ex in old:
        writer.submit(ex)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and writer.health().get("retention", {}).get("purged", 0) < len(old):
        time.sleep(0.1)
    fresh = _session_exchanges(1, 2, 6, time.time())
    for ex in fresh:
        writer.submit(ex)
    writer.close()
    assert writer.health()["retention"]["purged"] == len(old)
    conn = open_for_writing(path)
    assert {r[0] for r in conn.execute("select id from exchanges")} == {ex.id for ex in fresh}
    _check_store(conn, {ex.id: ex for ex in old + fresh})


def test_purge_from_another_process_while_the_writer_remembers_a_base(tmp_path):
    """The writer keeps each session's last body in memory as the next delta's base; a purge from
    `tapfix captures purge` may delete it. The next turn must still be stored so that it rebuilds.
    (Before the fix, turn 2 became a delta on a deleted body, or on itself once SQLite reused the id.)"""
    path = tmp_path / "c.db"
    turns = _session_exchanges(1, 3, 9, time.time() - 3600)
    writer = CaptureWriter(path)
    writer.submit(turns[0])
    _wait_written(writer, 1)
    other = open_for_writing(path)
    assert purge(other, older_than_s=0).exchanges == 1
    for ex in turns[1:]:
        ex.started_at = time.time()
        writer.submit(ex)
    writer.close()
    _check_store(other, {ex.id: ex for ex in turns})


def _wait_written(writer: CaptureWriter, n: int) -> None:
    deadline = time.monotonic() + 10
    while writer.health()["written"] < n and time.monotonic() < deadline:
        time.sleep(0.02)


def test_report_is_readable():
    from tapfix.proxy.store.retention import PurgeReport

    text = str(dataclasses.replace(PurgeReport(), exchanges=3, bodies=2, kept_bases=1))
    assert "purged 3 exchange(s)" in text and "kept 1 delta base(s)" in text
