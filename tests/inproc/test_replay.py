"""`tapfix replay` against real servers: exact bytes out, every run stored and judged, bad input refused.

The degeneration tests run the real mock (in the test process) whose scenario makes every Nth answer degenerate,
and assert that the flags (in the store and in the summary) find exactly those runs.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from tapfix.proxy.cli.replay import replay
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.jsonsplice import splice
from tapfix.proxy.replay.client import resend_headers
from tapfix.proxy.replay.edits import parse_edits
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import list_captures
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.inproc import start_mock
from tests.support.procs import free_port
from tests.support.rawserver import RawServer

BODY = (
    b'{"model": "tapfix-mock", "stream": true, "top_p": 0.9,\n "messages": [{"role": "user", '
    b'"content": "Explain in two sentences why the sky is blue"}]}'
)
SSE_OK = [(0.0, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 14\r\n\r\ndata: [DONE]\n\n")]


def store_source(
    db: Path,
    upstream: str,
    body: bytes = BODY,
    *,
    forwarded: bytes | None = None,
    headers: list[tuple[str, str]] | None = None,
    capture_id: str | None = None,
    writer: CaptureWriter | None = None,
) -> str:
    """One captured exchange, as the proxy's writer stores it (the key redacted on the way in); `writer`:
    another store's (then `db` is unused), closed here too."""
    headers = headers or [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-stored-key-0123456789"),
        ("user-agent", "opencode/0.15"),
        ("content-length", str(len(body))),
    ]
    ex = Exchange(
        method="POST",
        path="/v1/chat/completions",
        url="http://127.0.0.1:8080/v1/chat/completions",
        upstream_url=f"{upstream}/v1/chat/completions",
        model="tapfix-mock",
        stream=True,
        request=body,
        forwarded=forwarded,
        request_headers=headers,
        forwarded_headers=headers,
        status=200,
        content_type="text/event-stream",
        response_chunks=[b"data: [DONE]\n\n"],
        chunk_times=[0.001],
        user_agent="opencode/0.15",
    )
    if capture_id:
        ex.id = capture_id
    writer = writer or CaptureWriter(db)
    writer.submit(ex)
    writer.close()
    return ex.id


def run_replay(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(replay, list(args), env=env, catch_exceptions=False)


def json_rows(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def scenario(tmp: Path, every: int, style: str) -> Path:
    path = tmp / f"every{every}-{style}.json"
    path.write_text(json.dumps({"rules": [{"when": {"every": every}, "do": "degenerate", "style": style}]}))
    return path


@pytest.mark.parametrize(
    ("every", "style", "flag"),
    [
        (4, "cjk_drift", "script_drift"),
        (3, "repeat_loop", "repetition_loop"),
    ],
)
def test_flags_and_summary_find_exactly_the_degenerate_runs(tmp_path: Path, every: int, style: str, flag: str) -> None:
    mock = start_mock(tmp_path, "--scenario", str(scenario(tmp_path, every, style)))
    try:
        db = tmp_path / "c.db"
        source = store_source(db, mock.url)
        result = run_replay(source, "--db", str(db), "--times", "8", "--json")
        table = run_replay(source, "--db", str(db), "--times", "8")  # the mock's counter goes on: 9..16
    finally:
        mock.stop()
    assert result.exit_code == 0, result.output
    rows = json_rows(result.output)
    bad = [r["run"] for r in rows if flag in r["flags"]]
    assert bad == [n for n in range(1, 9) if n % every == 0]
    assert [r["run"] for r in rows if r["outlier"]] == bad
    assert all(r["flags"] == [] for r in rows if r["run"] not in bad)
    assert all(r["status"] == 200 and r["ttft_ms"] is not None and r["similarity"] is not None for r in rows)
    conn = open_for_reading(db)
    flagged = {r["id"] for r in list_captures(conn, limit=0, flag=flag, tag="replay")}
    second_bad = [n for n in range(9, 17) if n % every == 0]
    assert {r["capture_id"] for r in rows if r["run"] in bad} <= flagged
    assert len(flagged) == len(bad) + len(second_bad)
    assert all(r["source_id"] == source for r in list_captures(conn, limit=0, tag="replay"))
    assert table.exit_code == 0, table.output
    assert f"{flag} ×{len(second_bad)}" in table.output
    assert "outliers: " + " ".join(f"#{n - 8}" for n in second_bad) in table.output


def test_concurrent_replays_are_all_stored_and_judged(tmp_path: Path) -> None:
    mock = start_mock(tmp_path, "--scenario", str(scenario(tmp_path, 4, "cjk_drift")), "--chunk-delay-ms", "1")
    try:
        db = tmp_path / "c.db"
        source = store_source(db, mock.url)
        result = run_replay(source, "--db", str(db), "--times", "12", "--concurrency", "4", "--json")
    finally:
        mock.stop()
    assert result.exit_code == 0, result.output
    rows = json_rows(result.output)
    drifted = {r["capture_id"] for r in rows if "script_drift" in r["flags"]}
    assert len(drifted) == 3 and drifted == {r["capture_id"] for r in rows if r["outlier"]}
    conn = open_for_reading(db)
    assert {r["id"] for r in list_captures(conn, limit=0, flag="script_drift")} == drifted
    assert len(list_captures(conn, limit=0, tag="replay")) == 12


def test_replay_resends_the_stored_bytes(tmp_path: Path) -> None:
    server = RawServer(lambda request: SSE_OK)
    try:
        db = tmp_path / "c.db"
        forwarded = BODY[:-1] + b', "temperature": 0.7}'
        source = store_source(db, "http://127.0.0.1:9", forwarded=forwarded)
        base = ["--db", str(db), "--upstream", server.url]
        assert run_replay(source, *base).exit_code == 0
        assert run_replay(source, *base, "--original").exit_code == 0
        result = run_replay(
            source,
            *base,
            "--key-env",
            "MY_KEY",
            "--set",
            "temperature=0",
            "--unset",
            "top_p",
            "--set",
            'chat_template_kwargs={"enable_thinking":false}',
            "--set",
            "user=alice",
            env={"MY_KEY": "sk-from-env-abcdef"},
        )
        assert result.exit_code == 0, result.output
        first, original, edited = server.requests[-3:]
    finally:
        server.close()
    assert first.body == forwarded and original.body == BODY
    assert first.path == "/v1/chat/completions"
    assert first.header("authorization") is None  # the stored key was redacted and is never resent
    assert first.header("user-agent") == "opencode/0.15" and first.header("accept-encoding") == "identity"
    assert edited.header("authorization") == "Bearer sk-from-env-abcdef"
    expected = splice(
        forwarded,
        parse_edits(["temperature=0", 'chat_template_kwargs={"enable_thinking":false}', "user=alice"], ["top_p"]),
    )
    assert edited.body == expected
    obj = json.loads(edited.body)
    assert obj["temperature"] == 0 and obj["chat_template_kwargs"] == {"enable_thinking": False}
    assert obj["user"] == "alice" and "top_p" not in obj
    assert edited.body.startswith(b'{"model": "tapfix-mock", "stream": true, "messages": [{"role"')  # spliced


def test_replay_record_is_linked_timed_and_flagged(tmp_path: Path) -> None:
    mock = start_mock(tmp_path, "--chunk-delay-ms", "2")
    try:
        db = tmp_path / "c.db"
        source = store_source(db, mock.url)
        result = run_replay(source, "--db", str(db), "--json")
    finally:
        mock.stop()
    assert result.exit_code == 0, result.output
    capture_id = json_rows(result.output)[0]["capture_id"]
    conn = open_for_reading(db)
    row = conn.execute("select * from exchanges where id = ?", (capture_id,)).fetchone()
    assert row["source_id"] == source and json.loads(row["tags"]) == ["replay"]
    assert row["stream"] == 1 and row["chunk_count"] > 3 and row["first_token_ms"] > 0
    assert row["content"] and row["finish_reason"] == "stop"
    assert "[redacted]" not in row["request_headers"] and "authorization" not in row["request_headers"].lower()


def test_session_replay_goes_turn_by_turn(tmp_path: Path) -> None:
    server = RawServer(lambda request: SSE_OK)
    db = tmp_path / "c.db"
    headers = [("content-type", "application/json"), ("x-session-id", "ses_demo")]
    turns = [BODY[:-1] + f', "turn": {i}}}'.encode() for i in range(3)]
    for body in turns:
        store_source(db, "http://127.0.0.1:9", body, headers=headers)
        time.sleep(0.002)
    try:
        args = ["--session", "ses_demo", "--db", str(db), "--upstream", server.url, "--times", "2"]
        first = run_replay(*args)
        again = run_replay(*args, "--json")
        sent = [r.body for r in server.requests]
    finally:
        server.close()
    assert first.exit_code == 0, first.output
    assert sent[:6] == turns + turns and len(sent) == 12  # a replayed session is never replayed again
    assert "turn" in first.output
    rows = json_rows(again.output)
    assert [(r["run"], r["turn"]) for r in rows] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    conn = open_for_reading(db)
    assert len(list_captures(conn, limit=0, session="ses_demo")) == 3
    sessions = {r["session_id"] for r in list_captures(conn, limit=0, tag="replay")}
    assert len(sessions) == 4 and "ses_demo" not in sessions  # one per run, turns together


def _count(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("select count(*) from exchanges").fetchone()[0]
    finally:
        conn.close()


def test_bad_input_gives_a_short_error_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    server = RawServer(lambda request: SSE_OK)
    try:
        source = store_source(db, server.url)
        cases = [
            (["nosuchid", "--db", str(db)], "no capture with id"),
            ([source, "--db", str(tmp_path / "missing.db")], "no capture database"),
            ([source, "--db", str(tmp_path / "foreign.db")], "not a tapfix capture database"),
            ([source, "--db", str(db), "--upstream", f"http://127.0.0.1:{free_port()}"], "unreachable"),
            ([source, "--db", str(db), "--set", "temperature"], "expected KEY=VALUE"),
            ([source, "--db", str(db), "--set", "a..b=1"], "dotted path"),
            ([source, "--db", str(db), "--key-env", "TAPFIX_TEST_UNSET_VAR"], "not set"),
            ([source, "--db", str(db), "--upstream", "ftp://x"], "http://"),
            (["--session", "nope", "--db", str(db)], "no session"),
        ]
        foreign = sqlite3.connect(tmp_path / "foreign.db")
        foreign.execute("create table t (x)")
        foreign.close()
        for args, message in cases:
            result = CliRunner().invoke(replay, args)
            assert result.exit_code == 2, (args, result.output)
            assert message in result.output and "Traceback" not in result.output, (args, result.output)
        assert not (tmp_path / "missing.db").exists()
        assert _count(db) == 1
        usage = CliRunner().invoke(replay, ["--db", str(db)])
        assert usage.exit_code == 2 and "capture ID or --session" in usage.output
    finally:
        server.close()


def test_http_errors_are_stored_and_exit_1(tmp_path: Path) -> None:
    server = RawServer(
        lambda request: [
            (
                0.0,
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json"
                b'\r\ncontent-length: 28\r\n\r\n{"error": {"message": "x"}}\n',
            )
        ]
    )
    try:
        db = tmp_path / "c.db"
        source = store_source(db, server.url)
        result = run_replay(source, "--db", str(db), "--times", "2")
    finally:
        server.close()
    assert result.exit_code == 1 and "500" in result.output and "0 ok" in result.output
    assert _count(db) == 3


def replays_in(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("select count(*) from exchanges where tags like '%replay%'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("stored", "header", "value"),
    [
        ([("Authorization", "[redacted]")], "authorization", "Bearer k"),
        ([("x-api-key", "[redacted]")], "x-api-key", "k"),
        ([], "authorization", "Bearer k"),
    ],
)
def test_the_key_goes_where_the_capture_had_one(stored, header: str, value: str) -> None:
    headers = resend_headers(
        [("Host", "a"), ("Content-Length", "3"), *stored, ("x-tapfix-capture-id", "1")], ("auto", "k")
    )
    assert headers == [("accept-encoding", "identity"), (header, value)]


def test_set_values_parse_as_json_when_they_can() -> None:
    edits = parse_edits(["temperature=0", 'stop=["x"]', "name=plain text", "flag=true", "n=null", 'q="0"'], [])
    assert [(e.path, e.value) for e in edits] == [
        (("temperature",), 0),
        (("stop",), ["x"]),
        (("name",), "plain text"),
        (("flag",), True),
        (("n",), None),
        (("q",), "0"),
    ]


def test_truth_1_replay_resends_the_header_bytes_as_captured(tmp_path: Path) -> None:
    """The store keeps header values as text (`\\xNN` for a byte that isn't UTF-8, `\\\\` for a
    backslash); a replay sends the bytes behind that text, not the escapes."""
    server = RawServer(lambda request: SSE_OK)
    try:
        db = tmp_path / "c.db"
        odd = "C:\\tmp a\udcff\udce9 é"  # a backslash, two bytes that aren't UTF-8, a UTF-8 é
        headers = [("content-type", "application/json"), ("x-odd", odd), ("content-length", str(len(BODY)))]
        source = store_source(db, server.url, headers=headers)
        result = run_replay(source, "--db", str(db))
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    (sent,) = server.requests
    assert b"\r\nx-odd: C:\\tmp a\xff\xe9 \xc3\xa9\r\n" in sent.head, sent.head


def test_json_output_is_one_object_per_run(tmp_path: Path) -> None:
    server = RawServer(lambda request: SSE_OK)
    try:
        db = tmp_path / "c.db"
        source = store_source(db, server.url)
        result = run_replay(source, "--db", str(db), "--times", "3", "--json")
    finally:
        server.close()
    lines = result.output.strip().splitlines()
    assert len(lines) == 3 and all(orjson.loads(line)["source_id"] == source for line in lines)


def test_replay_of_a_proxied_capture_goes_to_its_own_upstream(tmp_path: Path) -> None:
    """The full chain: an agent's request through `tapfix run`, then replayed with no --upstream."""
    import httpx

    from tests.support.inproc import start_proxy

    mock = start_mock(tmp_path, "--scenario", str(scenario(tmp_path, 4, "cjk_drift")))
    proxy = start_proxy(tmp_path, mock.url)
    try:
        response = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            content=BODY,
            headers={"content-type": "application/json", "authorization": "Bearer sk-agent-key-123456"},
        )
        source = response.headers["x-tapfix-capture-id"]
        from tests.support.procs import wait_capture

        wait_capture(proxy.extra["db"], source)
        # The proxy is still running and writing to the same database.
        result = run_replay(source, "--db", str(proxy.extra["db"]), "--times", "7", "--json")
    finally:
        proxy.stop()
        mock.stop()
    assert result.exit_code == 0, result.output
    rows = json_rows(result.output)
    assert [r["run"] for r in rows if "script_drift" in r["flags"]] == [
        3,
        7,
    ]  # the mock's 4th and 8th answers
    conn = open_for_reading(proxy.extra["db"])
    assert {r["id"] for r in list_captures(conn, limit=0, flag="script_drift")} == {
        r["capture_id"] for r in rows if r["run"] in (3, 7)
    }


def test_key_from_the_config_of_the_matching_upstream(tmp_path: Path) -> None:
    server = RawServer(lambda request: SSE_OK)
    try:
        config = tmp_path / "tapfix.toml"
        config.write_text(
            f'[upstreams.gpu0]\nbase_url = "{server.url}/v1"\nengine = "vllm"\napi_key_env = "GPU0_KEY"\n'
            '[models.m]\nupstream = "gpu0"\nupstream_model = "tapfix-mock"\n'
        )
        db = tmp_path / "c.db"
        source = store_source(db, server.url)
        result = run_replay(source, "--db", str(db), "--config", str(config), env={"GPU0_KEY": "k-config-123"})
        assert result.exit_code == 0, result.output
        assert server.requests[-1].header("authorization") == "Bearer k-config-123"
    finally:
        server.close()
