"""Trace ids in the store (issue 20, migration m005): written by the real `CaptureWriter`, read back by
`captures show` (text and --json against its schema), `captures list --trace` and the browser's exchange
page; an older store (before m005) still reads, and its writer migrates it."""

from __future__ import annotations

import json
import sqlite3
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient
from tapfix.proxy.browse import create_app
from tapfix.proxy.cli import main
from tapfix.proxy.exchange import Exchange

from tests.support.stores import M005_MADE, undo_sqlite_migration
from tests.unit.test_store_attempts import exchange, older_store, regenerated, write

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OTHER = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN, SPAN = "00f067aa0ba902b7", "b7ad6b7169203331"


@pytest.fixture
def db(tmp_path: Path) -> tuple[Path, list[Exchange]]:
    *attempts, parent = regenerated(attempts=1)
    parent.trace_id, parent.span_id, parent.parent_span_id = TRACE, SPAN, CLIENT_SPAN
    attempts[0].trace_id, attempts[0].span_id, attempts[0].parent_span_id = TRACE, "1" * 16, SPAN
    plain = exchange()  # no trace context
    other = exchange(trace_id=OTHER, parent_span_id=CLIENT_SPAN)  # export off: the client's trace only
    exchanges = [*attempts, parent, plain, other]
    write(tmp_path / "c.db", exchanges)
    return tmp_path / "c.db", [parent, attempts[0], plain, other]


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_writer_stores_the_ids_indexed_and_the_view_shows_the_trace(db: tuple[Path, list[Exchange]]) -> None:
    path, (parent, attempt, plain, other) = db
    conn = sqlite3.connect(path)
    rows = {r[0]: r[1:] for r in conn.execute("select id, trace_id, span_id, parent_span_id from exchanges")}
    assert rows[parent.id] == (TRACE, SPAN, CLIENT_SPAN)
    assert rows[attempt.id] == (TRACE, "1" * 16, SPAN)
    assert rows[plain.id] == (None, None, None) and rows[other.id] == (OTHER, None, CLIENT_SPAN)
    plan = " ".join(
        r[3] for r in conn.execute("explain query plan select id from exchanges where trace_id = ?", (TRACE,))
    )
    assert "idx_exchanges_trace_id" in plan
    assert conn.execute("select trace_id from exchange_view where id = ?", (parent.id,)).fetchone() == (TRACE,)


def test_show_prints_a_trace_line_and_json_carries_the_ids(db: tuple[Path, list[Exchange]]) -> None:
    path, (parent, _, plain, _) = db
    text = cli("captures", "show", parent.id, "--db", str(path))
    assert f"  trace: {TRACE}   span: {SPAN}   parent span: {CLIENT_SPAN}" in text.splitlines()
    assert "trace:" not in cli("captures", "show", plain.id, "--db", str(path))
    schema = json.loads((files("tapfix.schemas") / "capture.schema.json").read_text(encoding="utf-8"))
    for capture, ids in ((parent, (TRACE, SPAN, CLIENT_SPAN)), (plain, (None, None, None))):
        shown = json.loads(cli("captures", "show", capture.id, "--db", str(path), "--json"))
        jsonschema.validate(shown, schema)
        assert (shown["trace_id"], shown["span_id"], shown["parent_span_id"]) == ids


def test_list_by_trace_keeps_attempts_under_their_parent(db: tuple[Path, list[Exchange]]) -> None:
    path, (parent, attempt, _, other) = db
    rows = [
        json.loads(line) for line in cli("captures", "list", "--db", str(path), "--trace", TRACE, "--json").splitlines()
    ]
    assert [(r["id"], r["trace_id"]) for r in rows] == [(parent.id, TRACE), (attempt.id, TRACE)]
    upper = cli("captures", "list", "--db", str(path), "--trace", OTHER.upper(), "--json")
    assert [json.loads(line)["id"] for line in upper.splitlines()] == [other.id]
    assert (
        cli("captures", "list", "--db", str(path), "--trace", "f" * 32).strip()
        == f"no capture matches --trace {'f' * 32}"
    )


def test_the_exchange_page_shows_the_trace(db: tuple[Path, list[Exchange]]) -> None:
    path, (parent, _, plain, _) = db
    with TestClient(create_app(path, background_index=False), base_url="http://127.0.0.1") as client:
        page = client.get(f"/exchange/{parent.id}").text
        assert f'<code class="trace">{TRACE}</code>' in page and SPAN in page and CLIENT_SPAN in page
        assert 'class="trace"' not in client.get(f"/exchange/{plain.id}").text


def as_before_trace_context(path: Path) -> None:
    """What a tapfix before migration m005 left: no trace columns, no record of the migration."""
    undo_sqlite_migration(path, "m005_trace_context", *M005_MADE)


def test_an_older_store_reads_as_it_is_and_its_writer_migrates_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = older_store(path, as_before_trace_context)
    assert json.loads(cli("captures", "list", "--db", str(path), "--json"))["trace_id"] is None
    assert cli("captures", "list", "--db", str(path), "--trace", TRACE).startswith("no capture matches")
    assert json.loads(cli("captures", "show", old.id, "--db", str(path), "--json"))["trace_id"] is None
    new = exchange(trace_id=TRACE)
    write(path, [new])  # a writer migrates it
    rows = [
        json.loads(line) for line in cli("captures", "list", "--db", str(path), "--trace", TRACE, "--json").splitlines()
    ]
    assert [r["id"] for r in rows] == [new.id]
