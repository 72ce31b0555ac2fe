"""Regeneration attempts in the store (issue 19): each attempt is an exchange of its own, `attempt_of`
its client-facing capture, `attempt` 2...N+1; written through the real `CaptureWriter`, read back by the
CLI's reader, on new stores and on stores an older tapfix made."""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import jsonschema
import orjson
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.changes import Change
from tapfix.proxy.cli import main
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.replay.client import build_request, session_capture_ids
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import SqliteReader, list_captures, load_capture
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.builders import chat_chunk, sse_events, tool_call_chunk
from tests.support.depth import examples
from tests.support.stores import (
    BACKENDS,
    M004_MADE,
    M010_MADE,
    Backend,
    make_backend,
    streamed_chat,
    undo_sqlite_migration,
)

_made = itertools.count()


def exchange(**kw: object) -> Exchange:
    """A streamed chat exchange; `cut=True` answers with a tool call whose arguments stop short."""
    cut = kw.pop("cut", False)
    if cut:
        events = [tool_call_chunk(0, "c1", "read", '{"pa'), chat_chunk(finish_reason="tool_calls")]
    else:
        events = [chat_chunk({"content": "hi"}), chat_chunk(finish_reason="stop")]
    request = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"go"}]}'
    # ids increasing: new capture ids made in one millisecond need not be
    made = {"id": f"01t{next(_made):013d}", "request": request, "response_chunks": sse_events(events)}
    return streamed_chat(**(made | kw))


def regenerated(parent_id: str | None = None, attempts: int = 1) -> list[Exchange]:
    """A client-facing exchange flagged `regenerated`, and its attempts 2...attempts+1 (the last fine)."""
    parent = exchange(cut=True, flags={"regenerated"}, **({"id": parent_id} if parent_id else {}))
    made = [
        exchange(
            attempt_of=parent.id,
            attempt=n,
            cut=n < attempts + 1,
            request=b'{"model":"m","stream":true,"seed":%d,"messages":[{"role":"user","content":"go"}]}' % n,
            changes=[Change("toolcalls", "regenerate", "$", None, n, f"regenerate attempt {n}: arguments cut")],
        )
        for n in range(2, attempts + 2)
    ]
    return [*made, parent]  # the attempts end (and are written) before the client-facing exchange


def write(path: Path, exchanges: list[Exchange]) -> None:
    writer = CaptureWriter(path)
    for ex in exchanges:
        writer.submit(ex)
    writer.close()


def older_store(path: Path, undo: Callable[[Path], None]) -> Exchange:
    """Writes one exchange to a new store, then `undo` takes the store back to what an older tapfix left."""
    old = exchange()
    write(path, [old])
    undo(path)
    return old


def test_attempt_columns_round_trip(tmp_path: Path) -> None:
    *attempts, parent = regenerated(attempts=2)
    write(tmp_path / "a.db", [*attempts, parent])
    conn = open_for_reading(tmp_path / "a.db")
    shown = load_capture(conn, parent.id)
    assert (shown["attempt_of"], shown["attempt"]) == (None, 1)
    for ex in attempts:
        row = load_capture(conn, ex.id)
        assert (row["attempt_of"], row["attempt"]) == (parent.id, ex.attempt)
        assert [(c["stage"], c["reason"]) for c in row["change_rows"]] == [
            ("toolcalls", f"regenerate attempt {ex.attempt}: arguments cut")
        ]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request, tmp_path)


def test_an_attempt_is_not_a_session_turn(store: Backend) -> None:
    """Its reply is not what the client received: a later turn must continue the parent, and the
    session's turns (and a session replay) must not hold the attempts."""
    headers = [("x-session-id", "ses_1")]
    *attempts, parent = regenerated(attempts=1)
    for ex in (*attempts, parent):
        ex.request_headers = headers
    writer = store.writer()
    for ex in (*attempts, parent):
        writer.submit(ex)
    writer.close()
    rows = store.rows(
        "select id, session_id, chain_hash from exchanges where id in (?, ?)", (parent.id, attempts[0].id)
    )
    assert dict((r[0], r[1:]) for r in rows)[attempts[0].id] == (None, None)
    assert dict((r[0], r[1]) for r in rows)[parent.id] == "ses_1"
    assert store.rows("select exchanges from sessions where id = 'ses_1'") == [(1,)]


def test_a_kept_in_part_attempt_keeps_its_parent(store: Backend) -> None:
    """An attempt the writer can't store whole (`capture_failed`) still says whose attempt it is."""
    parent_id = "01jattemptparent000000000"
    attempt = exchange(attempt_of=parent_id, attempt=2)
    writer = store.writer()
    writer._write_one = lambda ex: (_ for _ in ()).throw(ValueError("boom"))  # type: ignore[method-assign]
    writer.submit(attempt)
    writer.close()
    [(flags, attempt_of, number)] = store.rows(
        "select flags, attempt_of, attempt from exchanges where id = ?", (attempt.id,)
    )
    assert "capture_failed" in json.loads(flags)
    assert (attempt_of, number) == (parent_id, 2)


def as_before_attempts(path: Path) -> None:
    """Turn a store into what a tapfix before migration m004 left: no attempt columns, no record of it (and
    before m010, whose covering index holds attempt_of)."""
    undo_sqlite_migration(path, "m010_route_and_token_details", *M010_MADE)
    undo_sqlite_migration(path, "m004_attempts", *M004_MADE)


def test_an_older_store_gains_the_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    old = older_store(db, as_before_attempts)
    columns = {r[1] for r in sqlite3.connect(db).execute("pragma table_info(exchanges)")}
    assert "attempt_of" not in columns
    # a reader reads the older store as it is (it never migrates)
    assert [(r["id"], r["attempt_of"], r["attempt"]) for r in list_captures(open_for_reading(db))] == [
        (old.id, None, 1)
    ]
    *attempts, parent = regenerated(attempts=1)
    write(db, [*attempts, parent])  # a writer migrates it
    conn = open_for_reading(db)
    kept = load_capture(conn, old.id)
    assert (kept["attempt_of"], kept["attempt"], kept["content"]) == (None, 1, "hi")
    assert load_capture(conn, attempts[0].id)["attempt_of"] == parent.id
    plan = " ".join(
        str(r[-1]) for r in conn.execute("explain query plan select id from exchanges where attempt_of = ?", ("x",))
    )
    assert "idx_exchanges_attempt_of" in plan


def test_list_groups_attempts_under_their_parent(tmp_path: Path) -> None:
    """Newest client request first, each followed by its attempts in order; `limit` counts client
    requests, so a parent never loses its attempts to the limit."""
    first = exchange()
    *attempts, parent = regenerated(attempts=2)
    last = exchange()
    write(tmp_path / "l.db", [first, *attempts, parent, last])
    conn = open_for_reading(tmp_path / "l.db")
    listed = [(r["id"], r["attempt_of"], r["attempt"]) for r in list_captures(conn, limit=0)]
    assert listed == [
        (last.id, None, 1),
        (parent.id, None, 1),
        (attempts[0].id, parent.id, 2),
        (attempts[1].id, parent.id, 3),
        (first.id, None, 1),
    ]
    assert [r["id"] for r in list_captures(conn, limit=2)] == [last.id, parent.id, attempts[0].id, attempts[1].id]
    assert [r["id"] for r in list_captures(conn, flag="regenerated")] == [parent.id, *(a.id for a in attempts)]


def test_filters_match_the_client_request(tmp_path: Path) -> None:
    """An attempt comes with its parent whatever the filter (it has no session of its own); an
    attempt whose parent isn't stored (lost, purged, or not written yet) is listed on its own."""
    *attempts, parent = regenerated(attempts=1)
    for ex in (*attempts, parent):
        ex.request_headers = [("x-session-id", "ses_1")]
    orphan = exchange(attempt_of="01jmissingparent000000000", attempt=2)
    write(tmp_path / "f.db", [*attempts, parent, orphan])
    conn = open_for_reading(tmp_path / "f.db")
    assert [r["id"] for r in list_captures(conn, session="ses_1")] == [parent.id, attempts[0].id]
    assert [r["id"] for r in list_captures(conn, limit=0)] == [orphan.id, parent.id, attempts[0].id]
    # the filters match client requests: a flag only an attempt carries lists neither it nor its parent
    fine = exchange(flags={"regenerated"})
    broken = exchange(attempt_of=fine.id, attempt=2, cut=True)
    write(tmp_path / "f.db", [broken, fine])
    assert "invalid_tool_call" in load_capture(conn, broken.id)["flags"]
    assert [r["id"] for r in list_captures(conn, flag="invalid_tool_call", limit=0)] == [parent.id, attempts[0].id]


def test_captures_list_cli_marks_attempts(tmp_path: Path) -> None:
    *attempts, parent = regenerated(attempts=1)
    write(tmp_path / "c.db", [*attempts, parent])
    text = CliRunner().invoke(main, ["captures", "list", "--db", str(tmp_path / "c.db"), "--flag", "regenerated"])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert lines[1].startswith(parent.id)
    assert lines[2].lstrip().startswith(f"↳2 {attempts[0].id}")
    as_json = CliRunner().invoke(main, ["captures", "list", "--db", str(tmp_path / "c.db"), "--json"])
    rows = [orjson.loads(line) for line in as_json.output.splitlines()]
    assert [(r["id"], r["attempt_of"], r["attempt"]) for r in rows] == [
        (parent.id, None, 1),
        (attempts[0].id, parent.id, 2),
    ]
    assert "regenerated" in rows[0]["flags"] and rows[0]["changes"] == 0


def test_replay_resends_the_one_capture_asked_for(tmp_path: Path) -> None:
    """`tapfix replay PARENT` resends what the client sent (the first attempt alone, no attempt folded
    in); `tapfix replay ATTEMPT` resends that attempt's body; a session replay holds no attempt."""
    *attempts, parent = regenerated(attempts=2)
    for ex in (*attempts, parent):
        ex.request_headers = [("x-session-id", "ses_1")]
        ex.upstream_url = "http://127.0.0.1:8000/v1/chat/completions"
    write(tmp_path / "r.db", [*attempts, parent])
    reader = SqliteReader(open_for_reading(tmp_path / "r.db"))
    assert build_request(reader, parent.id).body == parent.request
    for ex in attempts:
        assert build_request(reader, ex.id).body == ex.request != parent.request
    assert session_capture_ids(reader, "ses_1") == [parent.id]


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=6),
    orphans=st.integers(min_value=0, max_value=2),
    limit=st.integers(min_value=0, max_value=8),
)
def test_listing_shape_holds_for_any_mix(tmp_path_factory, shape: list[int], orphans: int, limit: int) -> None:
    """Any mix of client requests (each with 0-3 attempts) and orphan attempts: with `limit=0` every
    exchange is listed exactly once; top-level rows are newest first and at most `limit`; each attempt
    directly follows its parent or its parent's previous attempt, in attempt order."""
    exchanges: list[Exchange] = []
    for n in shape:
        exchanges += regenerated(attempts=n) if n else [exchange()]
    exchanges += [exchange(attempt_of=f"01jgone{i:09d}", attempt=2) for i in range(orphans)]
    path = tmp_path_factory.mktemp("mix") / "m.db"
    write(path, exchanges)
    conn = open_for_reading(path)
    everything = list_captures(conn, limit=0)
    assert sorted(r["id"] for r in everything) == sorted(ex.id for ex in exchanges)
    rows = list_captures(conn, limit=limit)
    stored = {ex.id for ex in exchanges}
    top = [r["id"] for r in rows if r["attempt_of"] is None or r["attempt_of"] not in stored]
    assert top == sorted(top, reverse=True) and (limit == 0 or len(top) <= limit)
    for before, row in itertools.pairwise(rows):
        if row["attempt_of"] in stored:
            assert row["attempt_of"] in (before["id"], before["attempt_of"])
            assert row["attempt"] == (before["attempt"] + 1 if before["attempt_of"] == row["attempt_of"] else 2)


def test_captures_show_json_names_the_attempt_and_its_parent(tmp_path: Path) -> None:
    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "capture.schema.json").read_text())
    attempt, parent = regenerated(attempts=1)
    write(tmp_path / "c.db", [attempt, parent])
    for ex, want in ((parent, (None, 1)), (attempt, (parent.id, 2))):
        shown = CliRunner().invoke(main, ["captures", "show", ex.id, "--db", str(tmp_path / "c.db"), "--json"])
        assert shown.exit_code == 0, shown.output
        obj = json.loads(shown.output)
        jsonschema.validate(obj, schema)
        assert (obj["attempt_of"], obj["attempt"]) == want
    text = CliRunner().invoke(main, ["captures", "show", attempt.id, "--db", str(tmp_path / "c.db")]).output
    assert f"attempt 2 of: {parent.id}" in text


def test_regeneration_numbers_its_attempts_after_a_route_fallbacks():
    """A route fallback's failed answer is attempt 2 (addons/route_fallback.py); a regeneration of the answer
    that replaced it numbers its own after it, and neither record is dropped."""
    from tapfix.proxy.regenerate.records import ATTEMPT_RECORDS, keep_attempt_records

    parent = Exchange()
    fallback = Exchange(attempt_of=parent.id, attempt=2)
    parent.extra[ATTEMPT_RECORDS] = [fallback]
    regenerated = [Exchange(attempt_of=parent.id, attempt=n) for n in (2, 3)]
    keep_attempt_records(parent, regenerated)
    kept = parent.extra[ATTEMPT_RECORDS]
    assert [r.attempt for r in kept] == [2, 3, 4] and kept[0] is fallback
