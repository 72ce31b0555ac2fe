from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st
from sqlite_utils import Database
from tapfix.proxy.store.bodies import common_prefix_len, common_suffix_len
from tapfix.proxy.store.sqlite.bodies import BodyReader, BodyWriter, read_body
from tapfix.proxy.store.sqlite.schema import migrations

from tests.support.depth import examples


def _conn() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrations.apply(Database(conn))
    return conn


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_common_prefix_and_suffix(a, b):
    p = common_prefix_len(a, b)
    assert a[:p] == b[:p] and (p == min(len(a), len(b)) or a[p] != b[p])
    s = common_suffix_len(a, b, min(len(a), len(b)) - p)
    assert p + s <= min(len(a), len(b))
    assert a[len(a) - s :] == b[len(b) - s :]


@settings(max_examples=examples(60))
@given(st.lists(st.binary(max_size=400), min_size=1, max_size=12), st.binary(min_size=1, max_size=2000))
def test_growing_conversation_reconstructs_exactly(turns, system):
    conn = _conn()
    writer = BodyWriter(conn)
    body = system
    ids = []
    expected = []
    for turn in turns:
        body = body[:-1] + turn + body[-1:]  # a new message spliced in before the closing bracket
        ids.append(writer.put(body, "session"))
        expected.append(body)
    for body_id, data in zip(ids, expected, strict=True):
        assert read_body(conn, body_id) == data


def test_long_session_costs_a_small_fraction():
    conn = _conn()
    writer = BodyWriter(conn)
    prefix = b'{"messages":[{"role":"system","content":"' + bytes(range(32, 127)) * 200 + b'"}'
    body = prefix + b"]}"
    raw = 0
    for turn in range(120):
        body = body[:-2] + b',{"role":"user","content":"turn %d %s"}]}' % (turn, b"z" * 300)
        raw += len(body)
        writer.put(body, "s1")
    stored = conn.execute("select sum(length(data)) from bodies").fetchone()[0]
    assert stored < 0.05 * raw
    assert conn.execute("select max(depth) from bodies").fetchone()[0] <= 48


def test_identical_bodies_are_stored_once():
    conn = _conn()
    writer = BodyWriter(conn)
    assert writer.put(b"same body", "a") == writer.put(b"same body", "b")
    assert conn.execute("select count(*) from bodies").fetchone()[0] == 1


def test_bases_beyond_the_memory_budget_are_reloaded_from_the_store(monkeypatch):
    import tapfix.proxy.store.bodies as bodies

    monkeypatch.setattr(bodies, "BASES_MEMORY_BUDGET", 3000)
    conn = _conn()
    writer = BodyWriter(conn)
    sessions = {f"s{i}": b'{"messages":[' + bytes([65 + i]) * 1000 for i in range(6)}
    expected = []
    for turn in range(4):
        for family, body in sessions.items():
            body = body + b',{"turn":%d}' % turn
            sessions[family] = body
            expected.append((writer.put(body + b"]}", family), body + b"]}"))
    assert writer._held <= 3000 + 1100
    assert all(read_body(conn, body_id) == data for body_id, data in expected)
    deltas = conn.execute("select count(*) from bodies where base_id is not null").fetchone()[0]
    assert deltas >= 3 * 6  # evicted families still got deltas after the first turn


@settings(max_examples=examples(60))
@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.binary(max_size=300)), min_size=1, max_size=70),
    st.lists(st.integers(0, 10**6), max_size=120),
    st.integers(0, 4),
    st.integers(0, 3000),
)
def test_reader_rebuilds_exactly_in_any_order_with_any_budget(edits, reads, max_bodies, max_bytes):
    """Splices anywhere (not only near the end), chains past MAX_DEPTH, and a reader that remembers
    few or no bodies, read in any order: always the bytes written."""
    conn = _conn()
    writer = BodyWriter(conn)
    body = b"x" * 200
    expected = []
    for at, insert in edits:
        cut = at % (len(body) + 1)
        body = body[:cut] + insert + body[cut + len(insert) // 2 :]
        expected.append((writer.put(body, "s"), body))
    reader = BodyReader(conn, max_bodies=max_bodies, max_bytes=max_bytes)
    for i in reads or range(len(expected)):
        body_id, data = expected[i % len(expected)]
        assert reader.read(body_id) == data == read_body(conn, body_id)


def test_reader_forgets_an_id_that_now_holds_another_body():
    """A purge can free a body's id and SQLite can give it to a new body: the reader checks sha256."""
    conn = _conn()
    writer = BodyWriter(conn)
    first = writer.put(b"the first body, long enough to be compressed " * 4)
    reader = BodyReader(conn)
    assert reader.read(first) == b"the first body, long enough to be compressed " * 4
    conn.execute("delete from bodies where id = ?", (first,))
    writer.forget()
    second = writer.put(b"another body under the same id")
    assert second == first
    assert reader.read(first) == b"another body under the same id"


@settings(max_examples=examples(60))
@given(
    st.lists(st.lists(st.sampled_from([b"a" * 70, b"b" * 90, b"{}", b"a" * 70 + b"!", b""]), max_size=6), max_size=5)
)
def test_a_batch_looked_up_together_stores_what_one_at_a_time_stores(batches):
    """`prefetch` (one statement for a transaction's bodies) against `put` alone: the same rows, every body read
    back; a body met earlier in the batch or in an earlier one is found, not stored twice."""
    together, alone = _conn(), _conn()
    batched, single = BodyWriter(together), BodyWriter(alone)
    for batch in batches:
        batched.prefetch(list(batch))
        ids = [batched.put(data, "s") for data in batch]
        batched.end_batch()
        assert [read_body(together, i) for i in ids] == batch
        assert [single.put(data, "s") for data in batch] == ids
    count = "select count(*), sum(length(data)) from bodies"
    assert together.execute(count).fetchone() == alone.execute(count).fetchone()
