"""Sessions from the data: the conversation's normal form, and the store rules that use it.

The end-to-end rules (real SDKs through a real proxy, two processes on one store) are in
tests/truth/test_sessions_truth.py; here are the parts they rest on, in process.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.assemble import Assembled
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.jsonsplice import SpliceError, array_item_spans, top_level_item_spans, top_level_spans
from tapfix.proxy.store.conversation import CONVERSATION_FIELDS, MAX_PARENTS, Conversation, Parser, reply_parts
from tapfix.proxy.store.kept import as_text
from tapfix.proxy.store.sessions import SessionTracker, response_id
from tapfix.proxy.store.sqlite.database import open_for_writing
from tapfix.proxy.store.sqlite.writer import SQLITE_SESSION_SQL
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.depth import examples


def conversation(body: dict[str, Any] | bytes, surface: Any = "chat", parser: Parser | None = None) -> Conversation:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    found = (parser or Parser()).conversation(raw, *top_level_item_spans(raw, CONVERSATION_FIELDS), surface)
    assert found is not None
    return found


def chained(request: dict[str, Any], content: str = "", calls: list[dict[str, Any]] | None = None, **kw: Any) -> str:
    """The chain hash an exchange gets for `request` answered with this reply."""
    found = conversation(request, **kw).chained(reply_parts(Assembled(content=content, tool_calls=calls or [])))
    assert found is not None
    return found


# -- the normal form ---------------------------------------------------------------------------------
TEXT = st.text(alphabet=st.sampled_from(list('ab "\\\n{}é😀')), min_size=1, max_size=12).filter(str.strip)
ARGS = st.dictionaries(st.sampled_from(["path", "content", "n"]), TEXT | st.integers(), max_size=3)


@given(TEXT, TEXT, ARGS, st.sampled_from([None, 0, 2]), st.booleans())
def test_a_resent_reply_is_the_parent_whatever_its_form(task, answer, args, indent, with_text):
    """Turn 2's parent is turn 1's chain, however the agent re-serializes turn 1's reply."""
    system = {"role": "system", "content": "You are an agent."}
    turn1 = {"model": "m", "messages": [system, {"role": "user", "content": task}]}
    text = answer if with_text else ""
    expected = chained(turn1, text, [{"id": "c1", "name": "write", "arguments": json.dumps(args)}])
    resent = {  # other key order, parts instead of a string, other spacing and id, a reasoning field
        "tool_calls": [
            {"function": {"arguments": json.dumps(args, indent=2), "name": "write"}, "type": "function", "id": "x9"}
        ],
        "reasoning_content": "hmm",
        "content": [{"type": "text", "text": f"  {text}\n"}] if with_text else None,
        "role": "assistant",
    }
    turn2 = {
        "messages": [system, {"content": [{"type": "text", "text": task}], "role": "user"}, resent]
        + [{"role": "tool", "tool_call_id": "x9", "content": "done"}],
        "model": "m",
    }
    raw = json.dumps(turn2, indent=indent, ensure_ascii=bool(indent)).encode()
    assert conversation(raw).parents == [expected]


def test_what_differs_differs():
    turn1 = {"messages": [{"role": "user", "content": "write it"}]}
    base = chained(turn1, "ok", [{"name": "write", "arguments": '{"path": "a"}'}])
    assert base != chained(turn1, "ok", [{"name": "write", "arguments": '{"path": "b"}'}])
    assert base != chained(turn1, "ok", [{"name": "edit", "arguments": '{"path": "a"}'}])
    assert base != chained(turn1, "ok!", [{"name": "write", "arguments": '{"path": "a"}'}])
    assert base != chained({"messages": [{"role": "user", "content": "write this"}]}, "ok")
    assert conversation(turn1).chained([]) is None  # nothing the client could continue


def test_responses_items_and_messages_blocks_chain():
    tools_reply = [{"id": "fc_1", "name": "read", "arguments": '{"path":"a"}'}]
    first = chained({"input": "Read a", "instructions": "Be brief"}, "Reading.", tools_reply, surface="responses")
    resent = [
        {"role": "user", "content": [{"type": "input_text", "text": "Read a"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Reading.", "annotations": []}]},
        {"type": "function_call", "id": "fc_9", "call_id": "call_1", "name": "read", "arguments": '{ "path": "a" }'},
        {"type": "function_call_output", "call_id": "call_1", "output": "hello"},
    ]  # fmt: skip
    assert conversation({"instructions": "Be brief", "input": resent}, surface="responses").parents == [first]

    ask = {"system": [{"type": "text", "text": "Be brief", "cache_control": {"type": "ephemeral"}}]}
    ask["messages"] = [{"role": "user", "content": "Read a"}]
    first = chained(
        ask, "Reading.", [{"id": "toolu_1", "name": "read", "arguments": '{"path":"a"}'}], surface="messages"
    )
    blocks = [
        {"type": "thinking", "thinking": "…", "signature": "s"},
        {"type": "text", "text": "Reading."},
        {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
    ]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"}]}
    later = {"system": "Be brief", "messages": [*ask["messages"], {"role": "assistant", "content": blocks}, result]}
    assert conversation(later, surface="messages").parents == [first]


def test_first_turns_have_no_parent_and_long_runs_a_bounded_lookup():
    assert (
        conversation({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}).parents == []
    )
    turns: list[Any] = [{"role": "user", "content": "go"}]
    for i in range(MAX_PARENTS + 10):
        turns += [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": "more"}]
    assert len(conversation({"messages": turns}).parents) == MAX_PARENTS


def test_items_seen_before_are_not_parsed_again():
    parser = Parser()
    big = {"role": "user", "content": "x" * 100_000}
    body = {"messages": [big, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}
    first = conversation(body, parser=parser)
    assert len(parser._seen) == 3
    assert conversation(body, parser=parser).parents == first.parents == conversation(body).parents


def test_not_a_conversation():
    parser = Parser()
    for body in (b'{"model": "m"}', b'{"messages": "hi"}', b'{"input": 3}', b'{"prompt": "legacy"}'):
        assert parser.conversation(body, *top_level_item_spans(body, CONVERSATION_FIELDS), "chat") is None, body
    opaque = b'{"messages": [{"role": "user"}, 1, "x", [2]]}'  # items it can't read count too
    assert parser.conversation(opaque, *top_level_item_spans(opaque, CONVERSATION_FIELDS), "chat") is not None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.sampled_from(list('a "\\\n{}[],:é'))),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2),
    max_leaves=8,
)


@given(
    st.dictionaries(st.sampled_from(["messages", "input", "model", "x"]), JSON, max_size=4), st.sampled_from([None, 1])
)
def test_one_pass_spans_agree_with_the_two_pass_ones(obj, indent):
    """`top_level_item_spans` = `top_level_spans` plus `array_item_spans` of each array, in one pass."""
    body = json.dumps(obj, indent=indent).encode()
    spans, items = top_level_item_spans(body, ("messages", "input"))
    assert spans == top_level_spans(body)
    expected = {
        k: list(array_item_spans(body, spans[k][0])) for k in ("messages", "input") if isinstance(obj.get(k), list)
    }
    assert items == expected
    for broken in (body[:-1], body + b"]"):
        try:
            top_level_spans(broken)
        except SpliceError:
            continue
        assert top_level_item_spans(broken, ("messages",))[0] == top_level_spans(broken)


def test_response_id_from_a_body_or_a_stream():
    assert response_id(b'{"id": "resp_1", "object": "response"}') == "resp_1"
    stream = (
        b'event: response.created\r\ndata: {"type":"response.created","response":{"status":"x","id":"resp_2"}}\r\n\r\n'
    )
    assert response_id(stream) == "resp_2"
    assert response_id(b"data: [DONE]\n\n") is None and response_id(b"") is None


# -- the store rules ----------------------------------------------------------------------------------
_CLOCK = itertools.count(1_700_000_000)  # one second per turn built: the order built is the order in time


def _turn(messages: list[Any], answer: str, **kw: Any) -> Exchange:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]}
    base: dict[str, Any] = dict(
        method="POST",
        path="/v1/chat/completions",
        request=orjson.dumps({"model": "m", "messages": messages}),
        model="m",
        status=200,
        content_type="application/json",
        response=orjson.dumps(body),
        client_addr="127.0.0.1",
        user_agent="agent/1",
        started_at=float(next(_CLOCK)),
    )
    return Exchange(**{**base, **kw})


def _write(db: Any, *exchanges: Exchange) -> None:
    """One writer (one `tapfix run`) writes these and closes."""
    writer = CaptureWriter(db)
    for ex in exchanges:
        writer.submit(ex)
    writer.close()
    assert writer.stats.failures == 0, writer.stats.last_error


def _sessions(db: Any) -> tuple[dict[str, str], dict[str, int]]:
    conn = sqlite3.connect(db)
    try:
        by_id = dict(conn.execute("select id, session_id from exchanges"))
        counts = dict(conn.execute("select id, exchanges from sessions"))
    finally:
        conn.close()
    return by_id, counts


def test_a_turn_written_before_its_parent_is_taken_in(tmp_path):
    """Two processes' writers are not ordered: turn 2 (process B) may reach the store first."""
    db = tmp_path / "s.db"
    user = {"role": "user", "content": "hi"}
    one = _turn([user], "hello")
    two = _turn([user, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}], "bye")
    bye = [{"role": "assistant", "content": "bye"}, {"role": "user", "content": "?"}]
    three = _turn([*orjson.loads(two.request)["messages"], *bye], "…")
    _write(db, two)
    _write(db, three)
    _write(db, one)
    by_id, counts = _sessions(db)
    assert by_id[one.id] == by_id[two.id] == by_id[three.id] == f"s-{one.id}"
    assert counts == {f"s-{one.id}": 3}


def test_a_waiting_turn_is_taken_in_by_its_parent_in_the_same_batch_or_a_later_one(tmp_path):
    """Whether any session waits is asked once a transaction: a turn that starts waiting in the batch counts, and
    so does one another writer added between this writer's transactions."""
    db = tmp_path / "s.db"
    user = {"role": "user", "content": "hi"}
    one = _turn([user], "hello")
    two = _turn([user, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}], "bye")
    other = _turn([{"role": "user", "content": "unrelated"}], "x")
    writer = CaptureWriter(db)
    try:
        # one transaction: `other` finds no session waiting, then `two` waits for `one`, then `one` comes
        assert writer._transaction([as_text(ex) for ex in (other, two, one)], writer._write_one) is None
    finally:
        writer.close()
    by_id, counts = _sessions(db)
    assert by_id[one.id] == by_id[two.id] == f"s-{one.id}" and counts[f"s-{one.id}"] == 2
    user2 = {"role": "user", "content": "again"}
    first, second = _turn([user2], "yes"), _turn([user2, {"role": "assistant", "content": "yes"}, user], "z")
    writer = CaptureWriter(db)
    try:
        unrelated = _turn([{"role": "user", "content": "unrelated too"}], "y")
        assert writer._transaction([as_text(unrelated)], writer._write_one) is None  # asks: nothing waits
        _write(db, second)  # another process, between two transactions: its turn waits for `first`
        assert writer._transaction([as_text(first)], writer._write_one) is None
    finally:
        writer.close()
    by_id, counts = _sessions(db)
    assert by_id[first.id] == by_id[second.id] == f"s-{first.id}" and counts[f"s-{first.id}"] == 2


def test_identical_runs_stay_apart_and_prefer_their_own_client(tmp_path):
    db = tmp_path / "s.db"
    user = {"role": "user", "content": "hi"}
    firsts = [_turn([user], "hello", user_agent=f"agent/{i}") for i in range(3)]
    follow = [user, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    seconds = [_turn(follow, "ok", user_agent=f"agent/{i}") for i in reversed(range(3))]
    again = [_turn([user], "hello") for _ in range(2)]  # two more runs of agent/1, each at its first turn
    same_agent = [_turn(follow, "ok") for _ in range(2)]  # their second turns: the oldest open run first
    _write(db, *firsts, *seconds, *again, *same_agent)
    by_id, counts = _sessions(db)
    for i in range(3):
        assert by_id[seconds[2 - i].id] == by_id[firsts[i].id]
    assert sorted(counts.values()) == [2] * 5


def test_previous_response_id_joins_and_waits(tmp_path):
    db = tmp_path / "s.db"

    def responses(rid: str, previous: str | None, text: str) -> Exchange:
        request: dict[str, Any] = {"model": "m", "input": text}
        if previous:
            request["previous_response_id"] = previous
        body = {"id": rid, "object": "response", "output": [{"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": text}]}]}  # fmt: skip
        return _turn([], "", path="/v1/responses", request=orjson.dumps(request), response=orjson.dumps(body))

    a, b, c = responses("resp_a", None, "one"), responses("resp_b", "resp_a", "two"), responses("resp_c", "resp_b", "3")
    _write(db, a, c)  # c arrives before b, which links it to a
    _write(db, b)
    by_id, counts = _sessions(db)
    assert by_id[a.id] == by_id[b.id] == by_id[c.id] and counts == {by_id[a.id]: 3}


def test_explicit_ids_come_first_and_copies_are_never_continued(tmp_path):
    db = tmp_path / "s.db"
    user = {"role": "user", "content": "hi"}
    tagged = _turn([user], "hello", request_headers=[("X-Session-Id", "ses_1")])
    replay = _turn([user], "hello", session_hint="replay-1", tags={"replay"})
    later = _turn([user, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}], "ok")
    _write(db, replay, tagged, later)
    by_id, _ = _sessions(db)
    assert by_id[tagged.id] == by_id[later.id] == "ses_1" and by_id[replay.id] == "replay-1"


def test_the_lookups_use_their_indexes(tmp_path):
    conn = open_for_writing(tmp_path / "s.db")
    seen: list[str] = []
    conn.set_trace_callback(lambda sql: seen.append(sql))
    tracker = SessionTracker(SQLITE_SESSION_SQL)
    later = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    link = tracker.assign(conn, _turn(later, "d"), Assembled(content="d"), b"")
    tracker.record(conn, link, _turn(later, "d"))
    tracker.assign(conn, _turn([], "", request=b'{"previous_response_id": "r", "input": []}'), Assembled(), b"")
    conn.set_trace_callback(None)
    plans = {}
    for sql in seen:
        if sql.lstrip().lower().startswith(("select", "with")):
            bound = sql  # the trace shows the statement with its values filled in
            plans[sql] = " ".join(r[3] for r in conn.execute("explain query plan " + bound))
    used = " | ".join(plans.values())
    assert "idx_exchanges_chain_hash" in used and "idx_exchanges_response_id" in used
    assert "idx_sessions_wants" in used and "SCAN e" not in used and "SCAN exchanges" not in used


# -- Claude Code's session header, and threads within a session (issue 31 item 17) ----------------------
CLAUDE = "X-Claude-Code-Session-Id"


def _threads(db: Any) -> dict[str, tuple[str | None, str | None]]:
    conn = sqlite3.connect(db)
    try:
        return {row[0]: (row[1], row[2]) for row in conn.execute("select id, session_id, thread_id from exchanges")}
    finally:
        conn.close()


def test_claude_codes_session_header_names_the_session(tmp_path):
    """A turn the client retried after an error lands in the session its header names, not one of its own."""
    db = tmp_path / "s.db"
    user = {"role": "user", "content": "write hello.txt"}
    failed = _turn([user], "", status=502, request_headers=[(CLAUDE, "cc-session-1")])
    retried = _turn([user], "done", request_headers=[(CLAUDE, "cc-session-1")])
    follow = [user, {"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]
    later = _turn(follow, "ok", request_headers=[(CLAUDE.lower(), "cc-session-1")])
    _write(db, failed, retried, later)
    by_id, counts = _sessions(db)
    assert by_id == {failed.id: "cc-session-1", retried.id: "cc-session-1", later.id: "cc-session-1"}
    assert counts == {"cc-session-1": 3}


def test_x_session_id_wins_over_claude_codes_header(tmp_path):
    db = tmp_path / "s.db"
    both = _turn([{"role": "user", "content": "hi"}], "yo", request_headers=[(CLAUDE, "cc"), ("x-session-id", "ses")])
    _write(db, both)
    assert _sessions(db)[0] == {both.id: "ses"}


def test_a_session_holds_several_threads(tmp_path):
    """Claude Code's subagents (and its side requests) send the main agent's session id: one session, a
    thread per chain of requests that extend each other. A thread is named by its first exchange's id;
    each later exchange joins the thread of the exchange it continues (the longest prefix, in its session)."""
    db = tmp_path / "s.db"
    header = [(CLAUDE, "cc-2")]
    main_user = {"role": "user", "content": "refactor the parser"}
    sub_user = {"role": "user", "content": "subagent: find every caller of parse()"}
    main1 = _turn([main_user], "I'll ask a subagent.", request_headers=header)
    sub1 = _turn([sub_user], "searching", request_headers=header)
    title = _turn(
        [{"role": "user", "content": "a title for: refactor the parser"}], "Parser refactor", request_headers=header
    )
    sub2 = _turn(
        [sub_user, {"role": "assistant", "content": "searching"}, {"role": "user", "content": "3 results"}],
        "callers: a, b, c",
        request_headers=header,
    )
    main2 = _turn(
        [main_user, {"role": "assistant", "content": "I'll ask a subagent."}, {"role": "user", "content": "a, b, c"}],
        "done",
        request_headers=header,
    )
    main3 = _turn(
        [*orjson.loads(main2.request)["messages"], {"role": "assistant", "content": "done"},
         {"role": "user", "content": "and tests?"}],
        "added",
        request_headers=header,
    )  # fmt: skip
    _write(db, main1, sub1, title, sub2, main2, main3)
    threads = _threads(db)
    assert {session for session, _ in threads.values()} == {"cc-2"}
    assert threads[main1.id][1] == threads[main2.id][1] == threads[main3.id][1] == main1.id
    assert threads[sub1.id][1] == threads[sub2.id][1] == sub1.id
    assert threads[title.id][1] == title.id


def test_threads_without_an_id_from_the_agent(tmp_path):
    """Sessions found by prefix have threads too: the session's first exchange starts its first thread."""
    db = tmp_path / "s.db"
    user = {"role": "user", "content": "hi"}
    one = _turn([user], "hello")
    two = _turn([user, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}], "bye")
    _write(db, one, two)
    threads = _threads(db)
    assert threads[one.id] == threads[two.id] == (f"s-{one.id}", one.id)


def test_copies_and_attempts_have_no_thread(tmp_path):
    db = tmp_path / "s.db"
    replay = _turn([{"role": "user", "content": "hi"}], "hello", session_hint="replay-1", tags={"replay"})
    _write(db, replay)
    assert _threads(db)[replay.id] == ("replay-1", None)


# -- the longest prefix alone first (issue 34) -----------------------------------------------------------------
hashes = st.sampled_from(["h0", "h1", "h2", "h3", "h4"])
rows = st.lists(
    st.tuples(hashes, st.sampled_from(["s1", "s2", None]), st.sampled_from(["a", "b"]), st.sampled_from(["t1", None])),
    max_size=8,
)


@settings(max_examples=examples(200), deadline=None)
@given(rows, st.lists(hashes, min_size=1, max_size=5), st.sampled_from(["a", "b"]), st.sampled_from(["s1", "s2"]))
def test_the_last_parent_first_finds_what_the_whole_lookup_finds(stored, parents, addr, session):
    """`_longest` asks for the last parent alone before all of them: the row it returns is the whole lookup's."""
    from tapfix.proxy.store.sessions import _longest

    conn = open_for_writing(":memory:")
    for i, (chain, session_id, client, thread) in enumerate(stored):
        conn.execute(
            "insert into exchanges (id, ts, started_at, chain_hash, session_id, client_addr, user_agent, thread_id)"
            " values (?, ?, '', ?, ?, ?, 'ua', ?)",
            (f"x{i}", i, chain, session_id, client, thread),
        )
        if session_id is not None:
            conn.execute(
                "insert or ignore into sessions (id, first_at, last_at, tip_hash) values (?, '', '', ?)",
                (session_id, chain),
            )

    def whole(sql, rest):
        values = ", ".join("(?, ?)" for _ in parents)
        args = [x for k, h in enumerate(parents) for x in (h, k)]
        found = conn.execute(sql.format(values=values), [*args, *rest]).fetchone()
        return None if found is None else tuple(found)

    for sql, rest in ((SQLITE_SESSION_SQL.continued, [addr, "ua"]), (SQLITE_SESSION_SQL.continued_in, [session])):
        assert _longest(conn, sql, parents, rest) == whole(sql, rest)
