from __future__ import annotations

import os
import sqlite3
import stat

import pytest
from tapfix.proxy.changes import Change
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.exchange_row import unpack_timing
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import capture_body, list_captures, load_capture
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.stores import BACKENDS, Backend, make_backend, streamed_chat


def _exchange(**kw) -> Exchange:
    answer = [b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n', b"data: [DONE]\n\n"]
    return streamed_chat(**({"request": b'{"model":"m","messages":[]}', "response_chunks": answer} | kw))


def test_round_trip_with_changes_and_timing(tmp_path):
    db = tmp_path / "c.db"
    writer = CaptureWriter(db)
    ex = _exchange(
        forwarded=b'{"model":"m","messages":[],"top_p":0.95}',
        changes=[Change("sampling", "inject", "$.top_p", None, 0.95, "generation_config.json of m")],
    )
    writer.submit(ex)
    writer.close()
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600
    conn = open_for_reading(db)
    capture = load_capture(conn, ex.id[:10])
    assert capture["content"] == "hi" and capture["changes"] == 1
    assert capture["change_rows"][0]["after"] == 0.95
    assert capture_body(conn, capture, "request") == ex.request
    assert capture_body(conn, capture, "forwarded") == ex.forwarded
    assert capture_body(conn, capture, "response") == b"".join(ex.response_chunks)
    assert [round(t) for t, _ in unpack_timing(capture["chunk_timing"])] == [10, 20]


def test_reader_never_migrates_or_creates(tmp_path):
    with pytest.raises(StoreError):
        open_for_reading(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(StoreError):
        open_for_reading(empty)
    assert sqlite3.connect(empty).execute("select count(*) from sqlite_master").fetchone()[0] == 0


def test_privacy_mode_keeps_metadata_only(tmp_path):
    writer = CaptureWriter(tmp_path / "p.db")
    ex = _exchange(store_bodies=False, request=b'{"secret":"prompt text"}')
    writer.submit(ex)
    writer.close()
    data = (tmp_path / "p.db").read_bytes()
    assert b"prompt text" not in data
    conn = open_for_reading(tmp_path / "p.db")
    assert list_captures(conn)[0]["id"] == ex.id
    with pytest.raises(StoreError):
        capture_body(conn, load_capture(conn, ex.id), "request")


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path) -> Backend:
    return make_backend(request, tmp_path)


def test_write_failure_is_counted_and_traffic_side_never_raises(store):
    writer = store.writer()
    store.drop("bodies")  # a broken store, under the running writer: no capture can be kept even in part
    first, second = _exchange(changes=[Change("x", "y", "$")]), _exchange()
    writer.submit(first)
    writer.submit(second)
    writer.close()
    health = writer.health()
    assert health["failures"] == 2 and health["written"] == 0 and "bodies" in health["last_error"]
    assert store.rows("select id from exchanges") == []


def test_flags_filter(tmp_path):
    writer = CaptureWriter(tmp_path / "g.db")
    cut_event = b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"length"}]}\n\n'
    cut = _exchange(response_chunks=[cut_event], chunk_times=[0.01])
    writer.submit(cut)
    writer.submit(_exchange())
    writer.close()
    conn = open_for_reading(tmp_path / "g.db")
    assert [r["id"] for r in list_captures(conn, flag="runaway_length")] == [cut.id]
    assert len(list_captures(conn, limit=0)) == 2
