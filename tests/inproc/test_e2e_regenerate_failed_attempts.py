"""Issue 31, items 4, 6, 7, 8 and 16: a later attempt that brings no answer the client can read is a failed
attempt, never forwarded, on every surface, streamed and not.

`tapfix run --regenerate 2 --regenerate-budget 3` in front of `tapfix mock`, whose rules pick, per model,
what attempts 2 and later send: a 503 whose body stalls, a compressed answer, one whose Content-Encoding
lies, an HTML page as `text/event-stream`, a JSON body on a streamed request, a 500. Attempt 1 is the
usual cut call. What follows a failed attempt is the next attempt, or, when none is left, the retryable
error the client would have had without regeneration; the real SDKs (`max_retries=0`) get either a
whole call or an error they retry, never a decode error. The records say what the client got."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.inproc.test_e2e_regenerate import rows
from tests.support.inproc import InprocMock, InprocProxy, start, start_mock, start_proxy
from tests.support.keepalive import TEST_KEEPALIVE_S as KEEPALIVE_S
from tests.support.keepalive import keepalive_every
from tests.support.procs import wait_capture
from tests.support.sdk_turn import CHAT_TOOLS, SURFACES, Surface, Turn, ask, prompt
from tests.support.stage_io import client_view

BUDGET_S = 3.0
STALL_BUDGET_S = 1.5  # the stalled-body tests wait the budget out: theirs is shorter (a 503's headers come at once)
SLACK_S = 5.0  # a shared, loaded machine: the bound is the budget plus this, never the stall (60 s)
STALL_S = 60
ENCODINGS = ("gzip", "br", "zstd", "deflate")
BROKEN = {"do": "break_tool_call", "mode": "truncate"}
GOOD = {"do": "answer"}
HTML = {"do": "garbage"}  # an HTML page and NULs, 200, text/event-stream
NOT_JSON_ANSWER = {"do": "garbage", "content_type": "application/json", "body": '{"detail": "busy, try later"}'}
LIE = {"do": "answer", "compress": "gzip", "compress_lie": True}  # says gzip, sends plain bytes
STALLED_503 = {"do": "http_error", "status": 503, "stall_s": STALL_S}


def model_rules(model: str, first: dict[str, Any], *later: dict[str, Any]) -> list[dict[str, Any]]:
    """Attempt 1 does `first`, attempt 2 `later[0]`, ...; the last of `later` holds for every later attempt."""
    rules = [{"when": {"model": model, "attempt": 1}, **first}]
    for number, rule in enumerate(later[:-1], start=2):
        rules.append({"when": {"model": model, "attempt": number}, **rule})
    return [*rules, {"when": {"model": model}, **later[-1]}]


SCENARIO: dict[str, Any] = {
    "rules": [
        *model_rules("stall-5xx", BROKEN, STALLED_503),
        *[r for enc in ENCODINGS for r in model_rules(f"compressed-{enc}", BROKEN, {**GOOD, "compress": enc})],
        *model_rules("lie-then-good", BROKEN, LIE, GOOD),
        *model_rules("lie-always", BROKEN, LIE),
        *model_rules("html-then-good", BROKEN, HTML, GOOD),
        *model_rules("html-always", BROKEN, HTML),
        *model_rules("json-then-good", BROKEN, NOT_JSON_ANSWER, GOOD),
        *model_rules("json-always", BROKEN, NOT_JSON_ANSWER),
        *model_rules("500-then-good", BROKEN, {"do": "http_error", "status": 500}, GOOD),
        *model_rules("500-always", BROKEN, {"do": "http_error", "status": 500}),
        *model_rules("notsse-first", HTML, GOOD),
        *model_rules("notsse-always", HTML, HTML),
    ]
}


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocMock]:
    tmp = tmp_path_factory.mktemp("failed-attempts")
    path = tmp / "scenario.json"
    path.write_text(json.dumps(SCENARIO))
    handle = start_mock(tmp, "--scenario", str(path))
    yield handle
    handle.stop()


MODELS = sorted({rule["when"]["model"] for rule in SCENARIO["rules"]})
SCENARIO["models"] = MODELS  # what the mock's /v1/models lists (config mode's preflight asks)


def config(mock: InprocMock, regenerate: int, budget: float) -> str:
    """Config mode, for the upstream's admission: this module asks for far more attempts a minute than
    `regenerate_per_minute`'s default lets through."""
    lines = [f"regenerate = {regenerate}", f"regenerate_budget = {budget}", "", "[upstreams.mock]"]
    lines += [f'base_url = "{mock.url}/v1"', 'engine = "vllm"', "regenerate_per_minute = 1000", ""]
    return "\n".join(lines + [f'[models."{model}"]' for model in MODELS]) + "\n"


@pytest.fixture(scope="module")
def proxy(mock: InprocMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocProxy]:
    handle = start_configured(tmp_path_factory.mktemp("failed-attempts-proxy"), config(mock, 2, BUDGET_S), shared=True)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def stall_proxy(mock: InprocMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocProxy]:
    """`proxy` with the stalled-body tests' shorter budget."""
    tmp = tmp_path_factory.mktemp("failed-attempts-stall-proxy")
    handle = start_configured(tmp, config(mock, 2, STALL_BUDGET_S), shared=True)
    yield handle
    handle.stop()


def start_configured(tmp: Path, text: str, shared: bool = False) -> InprocProxy:
    (tmp / "tapfix.toml").write_text(text)
    handle = start(["--config", str(tmp / "tapfix.toml"), "--db", str(tmp / "c.db")], tmp / "proxy.log", shared=shared)
    handle.extra["db"] = tmp / "c.db"
    return handle


def records(proxy: InprocProxy, turn: Turn, count: int) -> list[dict[str, Any]]:
    """The client-facing capture and its attempts, flags parsed."""
    assert turn.capture_id, turn
    found = rows(proxy.extra["db"], turn.capture_id, count)
    for row in found:
        row["flags"] = set(json.loads(row["flags"]))
    return found


def assert_retryable(turn: Turn, surface: Surface, stream: bool) -> None:
    """The SDK raised the error agents retry (a 502 or a server_error / api_error event), not a decode error."""
    assert turn.error is not None, f"the client got no error: {turn}"
    assert "server error" in turn.error_text, turn.error_text
    if not stream:
        assert getattr(turn.error, "status_code", None) == 502, turn.error
    elif surface == "messages":
        assert "api_error" in turn.error_text, turn.error_text


def assert_one_call(turn: Turn) -> None:
    assert turn.error is None, turn.error
    assert [name for name, _ in turn.calls] == ["write"], turn
    assert set(turn.calls[0][1]) == {"filePath", "content"}, turn.calls


def each_turn(**more: Iterable[str]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Runs the test on every SDK surface, streamed and whole, and for each value of each keyword's parameter."""

    def mark(test: Callable[..., None]) -> Callable[..., None]:
        for name, values in more.items():
            test = pytest.mark.parametrize(name, list(values))(test)
        test = pytest.mark.parametrize("surface", SURFACES)(test)
        return pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])(test)

    return mark


# -- 6: a compressed answer is decoded, never spliced raw into the client's stream --------------------
@each_turn(encoding=ENCODINGS)
def test_a_compressed_later_attempt_reaches_the_sdk_decoded(
    proxy: InprocProxy, surface: Surface, stream: bool, encoding: str
) -> None:
    turn = ask(proxy.url, surface, f"compressed-{encoding}", stream)
    assert_one_call(turn)
    parent, second = records(proxy, turn, 2)
    assert "regenerated" in parent["flags"] and "toolcall_unrecoverable" not in parent["flags"]
    assert second["status"] == 200 and not second["flags"] & {"upstream_error", "undecodable_body"}
    assert "empty_answer" not in second["flags"], "the attempt's record reads its answer decoded"
    headers = {k.lower(): v for k, v in json.loads(second["response_headers"])}
    assert headers["content-encoding"] == encoding, "the attempt's record keeps what the upstream sent"


# -- 6, 7: an answer that can't be read is a failed attempt: the next one follows --------------------
THEN_GOOD = {
    "lie-then-good": {"undecodable_body"},
    "html-then-good": set(),
    "json-then-good": set(),
    "500-then-good": set(),
}


@each_turn(model=THEN_GOOD)
def test_an_unreadable_later_attempt_is_followed_by_the_next(
    proxy: InprocProxy, surface: Surface, stream: bool, model: str
) -> None:
    turn = ask(proxy.url, surface, model, stream)
    assert_one_call(turn)
    parent, second, third = records(proxy, turn, 3)
    assert [r["attempt"] for r in (parent, second, third)] == [1, 2, 3]
    assert "regenerated" in parent["flags"] and "toolcall_unrecoverable" not in parent["flags"]
    assert "upstream_error" in second["flags"] and second["error"], second
    assert THEN_GOOD[model] <= second["flags"]
    assert third["status"] == 200 and "upstream_error" not in third["flags"]
    why = [c for c in third["changes"] if c["kind"] == "regenerate"]
    assert len(why) == 1 and json.loads(why[0]["before"]) == "unrecoverable", "judged like the attempt it replaced"


# -- 6, 7, 8: when every attempt fails, the client gets the retryable error, and the record says so -----
ALWAYS = {"lie-always": {"undecodable_body"}, "html-always": set(), "json-always": set(), "500-always": set()}


@each_turn(model=ALWAYS)
def test_every_later_attempt_unreadable_is_the_retryable_error(
    proxy: InprocProxy, surface: Surface, stream: bool, model: str
) -> None:
    turn = ask(proxy.url, surface, model, stream)
    assert_retryable(turn, surface, stream)
    assert "tool call" in turn.error_text, "the error is attempt 1's unrecoverable call, as without regeneration"
    parent, *later = records(proxy, turn, 3)
    assert [r["attempt"] for r in later] == [2, 3]
    # What the client got: the unrecoverable call's error, whatever the failed attempts were.
    assert {"regenerated", "toolcall_unrecoverable"} <= parent["flags"], parent["flags"]
    for attempt in later:
        assert "upstream_error" in attempt["flags"] and attempt["error"], attempt
        assert ALWAYS[model] <= attempt["flags"]
    skips = [json.loads(c["after"]) for c in parent["changes"] if c["kind"] == "skip"]
    assert skips == ["attempts_spent"]


# -- 4: a later attempt is bounded by the budget, headers and body ------------------------------------
@each_turn()
def test_a_later_attempt_whose_error_body_stalls_ends_within_the_budget(
    stall_proxy: InprocProxy, surface: Surface, stream: bool
) -> None:
    started = time.monotonic()
    turn = ask(stall_proxy.url, surface, "stall-5xx", stream, timeout=30)
    waited = time.monotonic() - started
    assert waited < STALL_BUDGET_S + SLACK_S, f"the client waited {waited:.1f} s with a {STALL_BUDGET_S:g} s budget"
    assert_retryable(turn, surface, stream)
    parent, second = records(stall_proxy, turn, 2)
    assert {"regenerated", "toolcall_unrecoverable"} <= parent["flags"], parent["flags"]
    assert second["status"] == 503 and "budget" in second["error"], second["error"]
    skips = [json.loads(c["after"]) for c in parent["changes"] if c["kind"] == "skip"]
    assert skips == ["budget_spent"]


def _stream_chat(proxy: InprocProxy, model: str, timeout: float = 30) -> tuple[str, bytes, float]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt()}], "tools": CHAT_TOOLS, "stream": True}
    started = time.monotonic()
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=timeout) as r:
        data = b"".join(r.iter_raw())
        return r.headers["x-tapfix-capture-id"], data, time.monotonic() - started


def test_stalled_attempts_free_their_admission_slots(proxy: InprocProxy) -> None:
    """Two stalled attempts at once fill the upstream's two slots (regenerate_concurrency's default); each
    frees its slot when the budget ends it, so the next broken call is regenerated, not refused."""
    assert proxy.url  # back from stepping aside for stall_proxy before two threads reach it at once
    ended: list[tuple[str, bytes, float]] = []
    clients = [threading.Thread(target=lambda: ended.append(_stream_chat(proxy, "stall-5xx"))) for _ in range(2)]
    for client in clients:
        client.start()
    for client in clients:
        client.join(BUDGET_S + SLACK_S + 30)
    assert len(ended) == 2
    for _, data, waited in ended:
        assert waited < BUDGET_S + SLACK_S, f"a stalled attempt held its client {waited:.1f} s"
        assert client_view(data).errors, "the retryable error ended it"
    turn = ask(proxy.url, "chat", "500-then-good", stream=True)
    assert_one_call(turn)
    parent = records(proxy, turn, 3)[0]
    assert not [c for c in parent["changes"] if c["kind"] == "skip"], "no attempt was refused a slot"


@pytest.fixture
def waiting_proxy(mock: InprocMock, tmp_path: Path) -> Iterator[InprocProxy]:
    """A budget longer than the keep-alive interval (1 s here: tests/support/keepalive.py), so a keep-alive is due
    while an attempt stalls."""
    with keepalive_every(KEEPALIVE_S):
        handle = start_proxy(tmp_path, mock.url, "--regenerate", "1", "--regenerate-budget", str(KEEPALIVE_S + 2))
        yield handle
        handle.stop()


def test_keep_alives_reach_the_client_while_a_later_attempt_stalls(waiting_proxy: InprocProxy) -> None:
    budget = KEEPALIVE_S + 2
    capture_id, data, waited = _stream_chat(waiting_proxy, "stall-5xx")
    assert waited < budget + SLACK_S, f"the client waited {waited:.1f} s with a {budget:g} s budget"
    view = client_view(data)
    assert any(c.startswith(b": keep-alive") for c in view.comments), "no keep-alive while the attempt stalled"
    assert len(view.errors) == 1 and view.errors[0]["tapfix"]["reason"] == "tool_call_unrecoverable"
    assert view.done == 1 and data.rstrip().endswith(b"data: [DONE]")
    wait_capture(waiting_proxy.extra["db"], capture_id)


# -- 16: a stream that isn't SSE, on a request tapfix must read ----------------------------------------
@pytest.mark.parametrize("surface", SURFACES)
def test_a_first_attempt_that_is_not_sse_is_regenerated(proxy: InprocProxy, surface: Surface) -> None:
    turn = ask(proxy.url, surface, "notsse-first", stream=True)
    assert_one_call(turn)
    parent, second = records(proxy, turn, 2)
    assert {"regenerated", "not_sse"} <= parent["flags"], parent["flags"]
    assert "upstream_error" not in parent["flags"], "the client got attempt 2's good answer"
    why = [c for c in second["changes"] if c["kind"] == "regenerate"]
    assert len(why) == 1 and json.loads(why[0]["before"]) == "unreadable"


@pytest.mark.parametrize("surface", SURFACES)
def test_a_stream_that_is_never_sse_ends_with_the_retryable_error(proxy: InprocProxy, surface: Surface) -> None:
    turn = ask(proxy.url, surface, "notsse-always", stream=True)
    assert_retryable(turn, surface, stream=True)
    assert "not an event stream" in turn.error_text
    parent, *later = records(proxy, turn, 3)
    assert {"regenerated", "not_sse", "upstream_error"} <= parent["flags"], parent["flags"]
    assert "not an event stream" in parent["error"]
    injected = [c for c in parent["changes"] if c["stage"] == "stream" and c["kind"] == "inject"]
    assert len(injected) == 1 and "not an event stream" in injected[0]["after"], parent["changes"]
    assert all({"not_sse", "upstream_error"} <= attempt["flags"] for attempt in later)


@pytest.fixture(scope="module")
def direct_proxy(mock: InprocMock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocProxy]:
    """No regeneration: the stream owner reads the upstream's stream itself."""
    handle = start_proxy(tmp_path_factory.mktemp("not-sse-direct"), mock.url, "--regenerate", "0", shared=True)
    yield handle
    handle.stop()


@pytest.mark.parametrize("surface", SURFACES)
def test_without_regeneration_a_stream_that_is_not_sse_ends_with_the_retryable_error(
    direct_proxy: InprocProxy, surface: Surface
) -> None:
    turn = ask(direct_proxy.url, surface, "notsse-always", stream=True)
    assert_retryable(turn, surface, stream=True)
    (row,) = records(direct_proxy, turn, 1)
    assert {"not_sse", "upstream_error"} <= row["flags"], row["flags"]
    injected = [c for c in row["changes"] if c["stage"] == "stream" and c["kind"] == "inject"]
    assert len(injected) == 1, row["changes"]
    db = direct_proxy.extra["db"]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (upstream_bytes,) = conn.execute("select chunk_count from exchanges where id = ?", (row["id"],)).fetchone()
    finally:
        conn.close()
    assert upstream_bytes >= 1, "the record keeps what the upstream sent"


def test_a_stream_tapfix_need_not_read_still_passes_as_it_came(direct_proxy: InprocProxy, mock: InprocMock) -> None:
    """No tools: nothing reads the stream, so the upstream's bytes go through untouched, as before."""
    body = {"model": "notsse-always", "messages": [{"role": "user", "content": prompt()}], "stream": True}
    direct = httpx.post(mock.url + "/v1/chat/completions", json=body, timeout=10).content
    through = httpx.post(direct_proxy.url + "/v1/chat/completions", json=body, timeout=10)
    assert through.content == direct and b"<html>" in direct
