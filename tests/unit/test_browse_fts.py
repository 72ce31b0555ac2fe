"""The search sidecar: only each turn's new text, incremental by rowid, safe queries, rebuilt on a new db."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from tapfix.proxy.browse.turns import turn_delta
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.sqlite.bodies import read_body
from tapfix.proxy.store.sqlite.search_index import BodyCache, SearchIndex, sidecar_path, to_match
from tapfix.proxy.store.turns import lacks_sampling, new_in_turn, new_turn_text, text_of
from tapfix.proxy.store.writer import CaptureWriter

from tests.unit.test_browse_fixtures import build_db


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("hello", '"hello"'),
        ("hello world", '"hello" "world"'),
        ('"read file" now', '"read file" "now"'),
        ("tok*", '"tok"*'),
        ('a"b', '"ab"'),
        ("AND OR", '"AND" "OR"'),
        ("  ", ""),
        ("*", ""),
    ],
)
def test_to_match(query: str, match: str) -> None:
    assert to_match(query) == match


def test_new_in_turn() -> None:
    sys_, u1 = {"role": "system", "content": "s"}, {"role": "user", "content": "u1"}
    a1, t1 = {"role": "assistant", "content": "a1"}, {"role": "tool", "content": "result"}
    assert new_in_turn([sys_, u1]) == [u1]
    assert new_in_turn([sys_, u1, a1, t1]) == [t1]
    assert new_in_turn([sys_]) == [sys_]
    assert (
        new_turn_text(
            {
                "messages": [
                    sys_,
                    u1,
                    a1,
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "part one"},
                            {"type": "image_url", "image_url": {"url": "data:..."}},
                        ],
                    },
                ]
            }
        )
        == "part one"
    )
    assert new_turn_text({"input": "plain responses input"}) == "plain responses input"
    assert new_turn_text({"prompt": "completion prompt"}) == "completion prompt"
    assert new_turn_text([1, 2]) == ""


def test_text_of_tool_calls() -> None:
    msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "function": {"name": "read", "arguments": '{"p": 1}'}}],
    }
    assert text_of(msg) == 'read({"p": 1})'


def test_turn_delta() -> None:
    a, b, c, d = ({"role": "user", "content": x} for x in "abcd")
    assert turn_delta(None, [a]).added == [a]
    delta = turn_delta([a, b], [a, b, c, d])
    assert (delta.kept, delta.dropped, delta.added) == (2, 0, [c, d])
    delta = turn_delta([a, b, c], [a, d])  # compacted history
    assert (delta.kept, delta.dropped, delta.added) == (1, 2, [d])


def test_lacks_sampling() -> None:
    assert lacks_sampling({"messages": []}) is True
    assert lacks_sampling({"temperature": 0}) is False
    assert lacks_sampling({"top_k": 20, "temperature": None}) is False
    assert lacks_sampling({"temperature": None}) is True
    assert lacks_sampling(None) is None


def test_index_holds_only_new_text(tmp_path: Path) -> None:
    built = build_db(tmp_path / "c.db")
    index = SearchIndex(built.path)
    assert index.catch_up() == 7
    conn = sqlite3.connect(index.path)
    prompts = [r[0] for r in conn.execute("select prompt from doc order by rowid")]
    assert prompts[0] == "Fix the flaky test in parser_test.py"
    assert prompts[1] == "Go ahead, read tokenizer.py first"
    assert prompts[2] == "def tokenize(s): return s.split()"
    assert sum("You are opencode" in p for p in prompts) == 0  # the system prompt is never new text
    assert index.catch_up() == 0
    assert index.status() == (7, 7)
    facts = dict(conn.execute("select exchange_id, lacks_sampling from facts"))
    assert facts[built.ids["turn1"]] == 1 and facts[built.ids["sdk"]] == 0


def test_index_is_incremental_and_small(tmp_path: Path) -> None:
    path = tmp_path / "grow.db"
    writer = CaptureWriter(path)
    history: list[dict] = [{"role": "system", "content": "x" * 20000}]
    import orjson

    for turn in range(30):
        history.append({"role": "user", "content": f"question number {turn} " + "y" * 500})
        body = orjson.dumps({"model": "m", "messages": history})
        writer.submit(
            Exchange(
                method="POST",
                path="/v1/chat/completions",
                model="m",
                status=200,
                request=body,
                session_hint="s1",
                response=b'{"choices": [{"message": {"content": "ok"}}]}',
            )
        )
        history.append({"role": "assistant", "content": f"answer {turn}"})
        if turn == 14:
            writer._queue.put(None)
            writer._thread.join(5)
            index = SearchIndex(path)
            assert index.catch_up(batch=4) == 15
            writer = CaptureWriter(path)
    writer.close()
    assert index.catch_up(batch=4) == 15
    assert index.status() == (30, 30)
    conn = sqlite3.connect(index.path)
    assert conn.execute("select count(*) from doc where doc match 'number'").fetchone()[0] == 30
    indexed = conn.execute("select sum(length(prompt)) from doc").fetchone()[0]
    assert indexed < 30 * 600  # one user message per turn, not the whole resent history (~20 kB each)


def test_index_rebuilds_for_a_different_db(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    built = build_db(path)
    index = SearchIndex(path)
    index.catch_up()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(str(path) + suffix):
            os.remove(str(path) + suffix)
    rebuilt = build_db(path)  # same file name, new captures
    assert index.catch_up() == 7
    conn = sqlite3.connect(index.path)
    ids = {r[0] for r in conn.execute("select exchange_id from facts")}
    assert ids == set(rebuilt.ids.values()) and not ids & set(built.ids.values())


def test_body_cache_matches_read_body(tmp_path: Path) -> None:
    built = build_db(tmp_path / "c.db")
    conn = sqlite3.connect(built.path)
    cache = BodyCache(conn, size=2)
    for (body_id,) in conn.execute("select id from bodies order by id").fetchall() * 2:
        assert cache.get(body_id) == read_body(conn, body_id)
    assert cache.get(None) is None and cache.get(10**9) is None


def test_background_indexer(tmp_path: Path) -> None:
    built = build_db(tmp_path / "c.db")
    index = SearchIndex(built.path, tmp_path / "elsewhere.sqlite")
    index.start(interval=0.05)
    try:
        import time

        deadline = time.monotonic() + 10
        while index.status()[0] < 7 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.status() == (7, 7)
    finally:
        index.stop()
    assert not sidecar_path(built.path).exists()
