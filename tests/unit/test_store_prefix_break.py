"""The writer records each turn's prefix break in `exchanges.prefix_break`: the thread's previous request from
memory (not yet committed), the body the engine received, subagents apart, the bound on what is kept."""

from __future__ import annotations

import itertools
import sqlite3
from typing import Any

import orjson
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.prefix_breaks import PrefixTracker
from tapfix.proxy.store.writer import CaptureWriter

_CLOCK = itertools.count(1_700_000_000)
LINE = "x-anthropic-billing-header: cc_version=2.1.332.{}; cc_entrypoint=sdk-cli;"


def _messages_turn(system: list[Any], messages: list[Any], *, session: str = "cc-1", **kw: Any) -> Exchange:
    body = {"model": "m", "max_tokens": 100, "system": system, "messages": messages, "stream": False}
    answer = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}]}
    base: dict[str, Any] = dict(
        method="POST",
        path="/v1/messages",
        request=orjson.dumps(body),
        model="m",
        status=200,
        content_type="application/json",
        response=orjson.dumps(
            answer | {"usage": {"input_tokens": 2, "output_tokens": 1, "cache_read_input_tokens": 8}}
        ),
        client_addr="127.0.0.1",
        user_agent="claude-cli/2.1.332",
        request_headers=[("x-claude-code-session-id", session)],
        started_at=float(next(_CLOCK)),
    )
    return Exchange(**{**base, **kw})


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _breaks(db: Any) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    try:
        return {i: b and orjson.loads(b) for i, b in conn.execute("select id, prefix_break from exchanges")}
    finally:
        conn.close()


USER = {"role": "user", "content": "fix the bug"}
TURN2 = [USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]


def test_each_turn_against_its_threads_previous_request_in_one_batch(tmp_path):
    """Three turns and a subagent written in one transaction (they came 0.7 s apart): turn 2 extends turn 1,
    turn 3's billing line changed, the subagent starts a thread of its own."""
    db = tmp_path / "c.db"
    main = [_text(LINE.format("4e6")), _text("You are Claude Code.")]
    one = _messages_turn(main, [USER])
    two = _messages_turn(main, TURN2)
    sub = _messages_turn([main[0], _text("You are a search subagent.")], [{"role": "user", "content": "grep"}])
    turn3 = [*TURN2, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and more"}]
    three = _messages_turn([_text(LINE.format("a1f")), main[1]], turn3)
    writer = CaptureWriter(db)
    for ex in (one, two, sub, three):
        writer.submit(ex)
    writer.close()
    found = _breaks(db)
    assert found[one.id] is None and found[two.id] is None and found[sub.id] is None
    got = found[three.id]
    assert (got["path"], got["cause"], got["previous"], got["body"]) == (
        "$.system[0].text",
        "billing_line",
        two.id,
        "request",
    )
    assert three.request[got["offset"] : got["offset"] + 3] == b"a1f"
    assert writer.health()["prefix_breaks"] == {"billing_line": 1}


def test_the_forwarded_body_is_what_is_compared():
    """tapfix removed the billing line before the engine: the engine's prompt extends, no break."""
    tracker = PrefixTracker()
    main = [_text("You are Claude Code.")]
    one = _messages_turn([_text(LINE.format("4e6")), *main], [USER])
    one.forwarded = orjson.dumps({"model": "m", "system": main, "messages": [USER]})
    two = _messages_turn([_text(LINE.format("a1f")), *main], TURN2)
    two.forwarded = orjson.dumps({"model": "m", "system": main, "messages": TURN2})
    assert tracker.observe(one, "cc-1", own_session=False) is None
    assert tracker.observe(two, "cc-1", own_session=False) is None


def test_a_chat_client_without_a_session_id_is_followed_by_its_address_and_agent():
    """A chat client edited its system prompt: the store starts a new session (the history's digests changed),
    the break is still found against the same client's previous turn; another client's is never used."""
    tracker = PrefixTracker()

    def chat(system: str, more: list[Any], addr: str = "127.0.0.1") -> Exchange:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "hi"}, *more]
        return Exchange(
            path="/v1/chat/completions",
            request=orjson.dumps({"model": "m", "messages": messages}),
            client_addr=addr,
            user_agent="OpenAI/Python",
        )

    one = chat("Be terse.", [])
    assert tracker.observe(one, f"s-{one.id}", own_session=True) is None
    later = [{"role": "assistant", "content": "hey"}, {"role": "user", "content": "go"}]
    other = chat("Be kind.", later, addr="10.0.0.2")
    assert tracker.observe(other, f"s-{other.id}", own_session=True) is None
    two = chat("Be kind.", later)
    got = tracker.observe(two, f"s-{two.id}", own_session=True)
    assert (got["path"], got["cause"], got["previous"]) == ("$.messages[0].content", "system_edited", one.id)


def test_an_exchange_written_again_meets_neither_itself_nor_what_came_after_it():
    """A failed batch is written again one exchange at a time: each is compared as the first time."""
    tracker = PrefixTracker()
    one = _messages_turn([_text("A")], [USER])
    two = _messages_turn([_text("B")], TURN2)
    assert tracker.observe(one, "cc-1", own_session=False) is None
    first = tracker.observe(two, "cc-1", own_session=False)
    assert first is not None and first["cause"] == "system_edited"
    assert tracker.observe(one, "cc-1", own_session=False) is None  # not "compared with turn 2"
    assert tracker.observe(two, "cc-1", own_session=False) == first
    assert len(tracker._recent["cc-1"]) == 2


def test_copies_and_attempts_are_not_turns():
    tracker = PrefixTracker()
    one = _messages_turn([_text("A")], [USER])
    assert tracker.observe(one, "cc-1", own_session=False) is None
    for copy in (
        _messages_turn([_text("B")], TURN2, tags={"replay"}),
        _messages_turn([_text("B")], TURN2, attempt_of=one.id, attempt=2),
    ):
        assert tracker.observe(copy, "cc-1", own_session=False) is None


def test_what_is_kept_is_bounded_by_bytes_and_per_session():
    tracker = PrefixTracker(max_bytes=2000, per_session=3)
    for i in range(40):
        tracker.observe(_messages_turn([_text("A")], [USER], session=f"s{i % 7}"), f"s{i % 7}", own_session=False)
    assert tracker._bytes <= 2000
    assert all(len(q) <= 3 for q in tracker._recent.values())
    assert tracker._bytes == sum(len(r.body) for q in tracker._recent.values() for r in q)


def _three_turns(db: Any) -> list[Exchange]:
    main = [_text(LINE.format("4e6")), _text("You are Claude Code.")]
    turn3 = [*TURN2, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and more"}]
    turns = [
        _messages_turn(main, [USER]),
        _messages_turn(main, TURN2),
        _messages_turn([_text(LINE.format("a1f")), main[1]], turn3),
    ]
    writer = CaptureWriter(db)
    for ex in turns:
        writer.submit(ex)
    writer.close()
    return turns


def test_tail_rows_carry_the_break_and_its_mark(tmp_path):
    from tapfix.proxy.cli.prefix_view import tail_mark
    from tapfix.proxy.store.reader import CaptureFilter
    from tapfix.proxy.store.sqlite.database import open_for_reading
    from tapfix.proxy.store.sqlite.tail import Tail

    db = tmp_path / "c.db"
    one, two, three = _three_turns(db)
    rows = {r["id"]: r for r in Tail(open_for_reading(db), 0, CaptureFilter()).poll()}
    assert rows[three.id]["prefix_break"]["cause"] == "billing_line" and rows[two.id]["prefix_break"] is None
    assert tail_mark(rows[three.id]) == "  ✂ billing_line" and tail_mark(rows[two.id]) == ""


def test_the_browsers_session_view_marks_the_turn_where_it_broke(tmp_path):
    from starlette.testclient import TestClient
    from tapfix.proxy.browse import create_app

    db = tmp_path / "c.db"
    one, two, three = _three_turns(db)
    with TestClient(create_app(db, background_index=False), base_url="http://127.0.0.1") as client:
        html = client.get("/session/cc-1").text
        detail = client.get(f"/exchange/{three.id}").text
    marked = [
        chunk.split('href="/exchange/')[1][:16]
        for chunk in html.split('<li class="turn')[1:]
        if "prefixbreak" in chunk.split(">")[0]
    ]
    assert marked == [three.id[:16]]
    assert "prefix break</b> at <code>$.system[0].text</code>" in html and "billing_line" in html
    assert "prefix break</dt>" in detail and f'href="/exchange/{two.id}"' in detail
    assert html.count("(8 from cache)") == 3  # the engine's cached prompt tokens, beside each turn


def test_an_older_store_without_the_column_reads_as_without_breaks(tmp_path):
    """Readers read an older store as it is: the browser's session page and `captures show` still work."""
    db = tmp_path / "c.db"
    _three_turns(db)
    conn = sqlite3.connect(db)
    conn.execute("alter table exchanges drop column prefix_break")
    conn.commit()
    conn.close()
    from tapfix.proxy.store.locator import StoreLocator

    store = StoreLocator.of(db).backend().browse(search=False)
    try:
        stored = store.load_session("cc-1")
    finally:
        store.close()
    assert stored is not None and [r["prefix_break"] for r in stored.rows] == [None, None, None]


def test_a_session_begun_before_a_restart_is_compared_with_what_the_store_holds(tmp_path):
    """The next `tapfix run` (or another instance on one store) has nothing of the session in memory: the
    previous request comes from the store, as the engine received it."""
    db = tmp_path / "c.db"
    main = [_text(LINE.format("4e6")), _text("You are Claude Code.")]
    one = _messages_turn(main, [USER])
    one.forwarded = orjson.dumps({"model": "m", "system": main[1:], "messages": [USER]})  # tapfix stripped it
    two = _messages_turn(main, TURN2)
    two.forwarded = orjson.dumps({"model": "m", "system": main[1:], "messages": TURN2})
    first = CaptureWriter(db)
    for ex in (one, two):
        first.submit(ex)
    first.close()
    turn3 = [*TURN2, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and more"}]
    three = _messages_turn([_text("You are Claude Code, edited.")], turn3)
    four = _messages_turn(main[1:], turn3)  # extends two (as forwarded), not three
    second = CaptureWriter(db)
    for ex in (three, four):
        second.submit(ex)
    second.close()
    found = _breaks(db)
    assert (found[three.id]["cause"], found[three.id]["previous"]) == ("system_edited", two.id)
    assert found[four.id] is None


def test_privacy_mode_keeps_the_point_and_drops_the_excerpts(tmp_path):
    db = tmp_path / "c.db"
    secret = "the patient's name is Alice"
    one = _messages_turn([_text(secret)], [USER], store_bodies=False)
    two = _messages_turn([_text(secret + " and Bob")], TURN2, store_bodies=False)
    writer = CaptureWriter(db)
    for ex in (one, two):
        writer.submit(ex)
    writer.close()
    found = _breaks(db)[two.id]
    assert (found["path"], found["cause"]) == ("$.system[0].text", "system_edited")
    assert "old" not in found and "new" not in found
    assert b"Alice" not in db.read_bytes()


def test_the_request_sides_parse_is_read_only_for_the_bytes_it_was_made_of(tmp_path):
    """Issue 34: the writer reads the router's parse of the forwarded body (jsonbody.STORE_PARSE_KEY) instead of
    parsing it again; a pair whose bytes are not the body compared (changed after it was noted) is not used."""
    main = [_text(LINE.format("4e6")), _text("You are Claude Code.")]
    turn3 = [*TURN2, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and more"}]
    two = _messages_turn(main, TURN2)
    three = _messages_turn([_text(LINE.format("a1f")), main[1]], turn3)
    stale = three.request.replace(b"a1f", b"4e6")
    # Made of other bytes: ignored, the body is parsed and the billing line's change found.
    tracker = PrefixTracker()
    assert tracker.observe(two, "cc-1", own_session=False, noted=(two.request, orjson.loads(two.request))) is None
    got = tracker.observe(three, "cc-1", own_session=False, noted=(stale, orjson.loads(stale)))
    assert got is not None and got["cause"] == "billing_line"
    # Made of these bytes: read as it is (this one says the line never changed: no break).
    tracker = PrefixTracker()
    assert tracker.observe(two, "cc-1", own_session=False, noted=(two.request, orjson.loads(two.request))) is None
    assert tracker.observe(three, "cc-1", own_session=False, noted=(bytes(three.request), orjson.loads(stale))) is None
