"""`tapfix_body` / `tapfix_body_bytes` on a store the real CaptureWriter filled (store/sql_functions.py)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.store.bodies import BODY_KINDS
from tapfix.proxy.store.sql_functions import register
from tapfix.proxy.store.sqlite.database import read_only_uri
from tapfix.proxy.store.sqlite.reader import capture_body, load_capture

from tests.support.depth import examples
from tests.support.sql_store import Filled, fill_store


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Filled:
    return fill_store(tmp_path_factory.mktemp("sql") / "tapfix.db")


def _connect(path: Path, how: str) -> sqlite3.Connection:
    uri = {"ro": read_only_uri(path), "immutable": path.absolute().as_uri() + "?immutable=1"}[how]
    conn = sqlite3.connect(uri, uri=True)
    register(conn)
    return conn


@pytest.mark.parametrize("how", ["ro", "immutable"])
def test_every_kind_of_every_exchange_is_the_bytes_the_store_reader_returns(filled: Filled, how: str) -> None:
    conn = _connect(filled.path, how)
    reader = sqlite3.connect(read_only_uri(filled.path), uri=True)
    reader.row_factory = sqlite3.Row
    assert conn.execute("select max(depth) from bodies").fetchone()[0] >= 2  # the session really is deltas
    private = filled.ids["private"]
    for exchange_id, sent in filled.bodies.items():
        if exchange_id == private:
            continue
        capture = load_capture(reader, exchange_id)
        for kind in BODY_KINDS:
            exact, text = conn.execute(
                "select tapfix_body_bytes(?, ?), tapfix_body(?, ?)", (exchange_id, kind, exchange_id, kind)
            ).fetchone()
            assert exact == sent[kind] == capture_body(reader, capture, kind), (exchange_id, kind)
            if exchange_id != filled.ids["binary"]:
                assert text == sent[kind].decode()  # TEXT, not a BLOB
    # forwarded / client_response are stored only when they differ: the fallbacks are what was stored
    ids = conn.execute(
        "select id, forwarded_body_id, client_response_body_id from exchanges where id in (?, ?)",
        (filled.ids["forwarded"], filled.ids["repaired"]),
    ).fetchall()
    assert {i: (f is not None, c is not None) for i, f, c in ids} == {
        filled.ids["forwarded"]: (True, False),
        filled.ids["repaired"]: (False, True),
    }


def test_utf8_is_text_anything_else_a_blob(filled: Filled) -> None:
    conn = _connect(filled.path, "ro")
    binary, session = filled.ids["binary"], filled.session[-1]
    types = conn.execute(
        "select typeof(tapfix_body(?, 'request')), typeof(tapfix_body(?, 'response')),"
        " typeof(tapfix_body(?, 'request')), typeof(tapfix_body_bytes(?, 'request'))",
        (binary, binary, session, session),
    ).fetchone()
    assert types == ("blob", "blob", "text", "blob")
    text = conn.execute("select tapfix_body(?, 'request')", (session,)).fetchone()[0]
    assert "✓" in text and "é" in text  # decoded as UTF-8, not Latin-1


def test_null_without_bodies_or_without_the_exchange(filled: Filled) -> None:
    conn = _connect(filled.path, "ro")
    private = filled.ids["private"]
    assert conn.execute("select request_size > 0 from exchanges where id = ?", (private,)).fetchone() == (1,)
    for exchange_id in (private, "no-such-exchange", None, 42):
        for kind in BODY_KINDS:
            row = conn.execute(
                "select tapfix_body(?, ?), tapfix_body_bytes(?, ?)", (exchange_id, kind, exchange_id, kind)
            ).fetchone()
            assert row == (None, None), (exchange_id, kind)


def test_unknown_kind_is_an_sql_error_that_lists_the_kinds(filled: Filled, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = _connect(filled.path, "ro")
    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    sqlite3.enable_callback_tracebacks(True)
    try:
        for kind in ("body", None, "REQUEST"):
            with pytest.raises(sqlite3.OperationalError, match="user-defined function raised exception"):
                conn.execute("select tapfix_body(id, ?) from exchanges", (kind,)).fetchall()
        with pytest.raises(sqlite3.OperationalError):  # even for an id no exchange has
            conn.execute("select tapfix_body_bytes('nope', 'headers')").fetchall()
    finally:
        sqlite3.enable_callback_tracebacks(False)
    messages = [str(e) for e in seen]
    assert len(messages) == 4
    for message in messages:
        assert "request, forwarded, response, client_response" in message


def test_the_view_needs_the_function_and_tables_do_not(filled: Filled) -> None:
    plain = sqlite3.connect(read_only_uri(filled.path), uri=True)
    with pytest.raises(sqlite3.OperationalError, match="no such function: tapfix_body"):
        plain.execute("select id from exchange_bodies limit 1").fetchall()
    assert plain.execute("select count(*) from exchanges").fetchone()[0] == len(filled.bodies)
    conn = _connect(filled.path, "ro")
    newest = conn.execute(
        "select id, request, response, forwarded, client_response from exchange_bodies order by id desc"
    ).fetchall()
    by_id = {row[0]: row[1:] for row in newest}
    last = filled.session[-1]
    assert by_id[last] == (
        filled.bodies[last]["request"].decode(),
        filled.bodies[last]["response"].decode(),
        None,
        None,
    )
    forwarded, repaired = filled.ids["forwarded"], filled.ids["repaired"]
    assert by_id[forwarded][2] == filled.bodies[forwarded]["forwarded"].decode()
    assert by_id[repaired][3] == filled.bodies[repaired]["client_response"].decode()
    assert by_id[filled.ids["private"]] == (None, None, None, None)


class _Counted(sqlite3.Connection):
    """Counts the statements being started, so a progress handler knows one runs inside another."""

    depth = 0

    def execute(self, *args: Any) -> sqlite3.Cursor:
        self.depth += 1
        try:
            return super().execute(*args)
        finally:
            self.depth -= 1


def test_a_time_limit_inside_the_function_interrupts_the_statement(filled: Filled) -> None:
    """Datasette's time limits are progress handlers: one that stops the function's own read must
    make the whole statement fail as "interrupted" (what Datasette treats as too slow), not as an
    error of the function (which it shows as an error page)."""
    conn = sqlite3.connect(read_only_uri(filled.path), uri=True, factory=_Counted)
    register(conn)
    conn.set_progress_handler(lambda: 1 if conn.depth >= 2 else 0, 1)  # only inside the function
    with pytest.raises(sqlite3.OperationalError) as raised:
        conn.execute("select tapfix_body(id, 'request') from exchanges").fetchall()
    assert raised.value.args == ("interrupted",)
    conn.set_progress_handler(None, 1)
    assert conn.execute("select count(tapfix_body(id, 'request')) from exchanges").fetchone()[0] > 0


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.lists(st.integers(0, 10**6), min_size=1, max_size=80))
def test_any_read_order_through_one_connection_gives_exact_bytes(filled: Filled, order: list[int]) -> None:
    """The reader remembers rebuilt bodies per connection: whatever the order the rows come in (a
    page sorted any way, the same row twice), every body is the one written."""
    conn = _connect(filled.path, "ro")
    for i in order:
        exchange_id = filled.session[i % len(filled.session)]
        got = conn.execute("select tapfix_body_bytes(?, 'request')", (exchange_id,)).fetchone()[0]
        assert got == filled.bodies[exchange_id]["request"]


@settings(max_examples=examples(5), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(notes=st.lists(st.text(max_size=600), min_size=1, max_size=2 * 48 + 5))
def test_a_generated_session_reads_back_exactly(notes: list[str], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Any conversation the writer deltas (chains restarting every MAX_DEPTH turns): the same bytes."""
    filled = fill_store(tmp_path_factory.mktemp("generated") / "tapfix.db", notes=notes)
    conn = _connect(filled.path, "immutable")
    for exchange_id in filled.session:
        row = conn.execute(
            "select tapfix_body_bytes(?, 'request'), tapfix_body(?, 'forwarded'), tapfix_body(?, 'client_response')",
            (exchange_id, exchange_id, exchange_id),
        ).fetchone()
        sent = filled.bodies[exchange_id]
        assert row == (sent["request"], sent["request"].decode(), sent["response"].decode())
