"""Issue 19, non-streamed: `tapfix run --regenerate N` in front of `tapfix mock`, real SDKs with
`max_retries=0` and `stream` off. A tool call broken on the first attempt comes back whole from the
second attempt, in the one answer the client gets (status 200 instead of today's 502); the store holds
the client-facing capture and each attempt, and counts one client request."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from tapfix.proxy.store.filters import Filters
from tapfix.proxy.store.locator import StoreLocator

from tests.inproc.test_e2e_regenerate import ALWAYS_BROKEN, WRITE, all_exchanges, messages, parent_id, rows
from tests.inproc.test_e2e_regenerate_timing import plain_body, slow_second_attempt
from tests.support.inproc import InprocProxy, cli, mock_and_proxy, start_proxy

RESPONSES_WRITE = {"type": "function", "name": "write", "parameters": WRITE["function"]["parameters"]}
MESSAGES_WRITE = {"name": "write", "description": "Write a file", "input_schema": WRITE["function"]["parameters"]}
PROMPT = "Create a file hello.txt containing a greeting"


@pytest.fixture
def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[InprocProxy]:
    # shared: it steps aside while a test runs a second proxy (one in-process proxy at a time)
    with mock_and_proxy(tmp_path, *request.param, shared=True) as (mock, proxy):
        proxy.extra["upstream"] = mock.url
        yield proxy


def post(proxy: InprocProxy, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(proxy.url + path, json={**body, "stream": False}, timeout=30)


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages(), "tools": [WRITE], **extra}


def regenerated_once(db: Path, capture_id: str, others: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parent and its attempt 2, checked for what every surface records the same way; `others`:
    the other clients' exchanges in the store."""
    found = rows(db, capture_id, 2)
    assert [(r["attempt"], r["attempt_of"]) for r in found] == [(1, None), (2, capture_id)]
    parent, second = found
    assert "regenerated" in json.loads(parent["flags"]) and parent["status"] == 200
    assert second["status"] == 200 and "regenerated" not in json.loads(second["flags"])
    why = [c for c in second["changes"] if c["kind"] == "regenerate"]
    assert len(why) == 1 and json.loads(why[0]["before"]) == "unrecoverable", second["changes"]
    assert all_exchanges(db) == 2 + others, "the mock was asked twice, each ask one exchange"
    return parent, second


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "1")], indirect=True)
def test_chat_a_call_broken_on_the_first_attempt_reaches_the_sdk_whole(stack: InprocProxy) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model="m",
        messages=messages(),  # type: ignore[arg-type]
        tools=[WRITE],  # type: ignore[list-item]
    )
    completion = raw.parse()
    call = completion.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "write"  # type: ignore[union-attr]
    assert set(json.loads(call.function.arguments)) >= {"content", "filePath"}  # type: ignore[union-attr]
    parent, second = regenerated_once(stack.extra["db"], raw.headers["x-tapfix-capture-id"])
    sent = json.loads(second["changes"][0]["after"])
    assert sent == "fresh_seed", second["changes"]
    seeds = [c for c in second["changes"] if c["path"] == "$.seed"]
    assert len(seeds) == 1 and isinstance(json.loads(seeds[0]["after"]), int)
    assert second["finish_reason"] == "tool_calls" and parent["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "1")], indirect=True)
def test_responses_a_call_broken_on_the_first_attempt_reaches_the_sdk_whole(stack: InprocProxy) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0, timeout=30)
    raw = client.responses.with_raw_response.create(model="m", input=PROMPT, tools=[RESPONSES_WRITE])  # type: ignore[list-item]
    response = raw.parse()
    calls = [item for item in response.output if item.type == "function_call"]
    assert response.status == "completed" and len(calls) == 1 and calls[0].name == "write"
    assert set(json.loads(calls[0].arguments)) >= {"content", "filePath"}
    _, second = regenerated_once(stack.extra["db"], raw.headers["x-tapfix-capture-id"])
    assert json.loads(second["changes"][0]["after"]) == "fresh", "Responses has no seed: sent again as it was"


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "1")], indirect=True)
def test_messages_a_call_broken_on_the_first_attempt_reaches_the_sdk_whole(stack: InprocProxy) -> None:
    client = anthropic.Anthropic(base_url=stack.url, api_key="k", max_retries=0, timeout=30)
    raw = client.messages.with_raw_response.create(
        model="m",
        max_tokens=1000,
        messages=[{"role": "user", "content": PROMPT}],
        tools=[MESSAGES_WRITE],  # type: ignore[list-item]
    )
    message = raw.parse()
    uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "write"
    assert set(uses[0].input) >= {"content", "filePath"}  # type: ignore[arg-type]
    regenerated_once(stack.extra["db"], raw.headers["x-tapfix-capture-id"])


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "0")], indirect=True)
def test_regenerate_0_is_todays_502(stack: InprocProxy) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0, timeout=30)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="m", messages=messages(), tools=[WRITE])  # type: ignore[arg-type,list-item]
    assert caught.value.status_code == 502
    capture_id = caught.value.response.headers["x-tapfix-capture-id"]
    found = rows(stack.extra["db"], capture_id, 1, timeout=1.0)
    assert [r["attempt"] for r in found] == [1] and "regenerated" not in json.loads(found[0]["flags"])
    assert not [c for c in found[0]["changes"] if c["kind"] in ("skip", "regenerate")]
    # The 502 is tapfix's: the engine answered 200 with a broken call, which is no engine error.
    assert "upstream_error" not in json.loads(found[0]["flags"]) and found[0]["error"] is None


def _error_shape(r: httpx.Response) -> tuple[int, Any, Any, Any]:
    error = r.json()["error"]
    return r.status_code, error["type"], error.get("code"), error.get("tapfix", {}).get("reason")


@pytest.mark.parametrize("stack", [(ALWAYS_BROKEN, "--regenerate", "2")], indirect=True)
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", chat_body()),
        ("/v1/responses", {"model": "m", "input": PROMPT, "tools": [RESPONSES_WRITE]}),
    ],
)
def test_every_attempt_broken_is_todays_error_and_every_attempt_is_stored(
    stack: InprocProxy, tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    r = post(stack, path, body)
    # today's answer: the same proxy's upstream, without regeneration
    plain = start_proxy(tmp_path, stack.extra["upstream"], "--regenerate", "0", db=tmp_path / "plain.db")
    try:
        today = post(plain, path, body)
    finally:
        plain.stop()
    assert _error_shape(r) == _error_shape(today) and r.status_code == 502
    assert r.json()["error"]["tapfix"]["reason"] == "tool_call_unrecoverable"
    capture_id = r.headers["x-tapfix-capture-id"]
    found = rows(stack.extra["db"], capture_id, 3)
    assert [(r["attempt"], r["attempt_of"]) for r in found] == [(1, None), (2, capture_id), (3, capture_id)]
    parent = found[0]
    assert parent["status"] == 502 and "regenerated" in json.loads(parent["flags"])
    skips = [c for c in parent["changes"] if c["kind"] == "skip"]
    assert [json.loads(c["after"]) for c in skips] == ["attempts_spent"]
    for attempt in found[1:]:
        assert "toolcall_unrecoverable" in json.loads(attempt["flags"])
        assert [c["kind"] for c in attempt["changes"]].count("regenerate") == 1


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "1")], indirect=True)
@pytest.mark.parametrize("deterministic", [{"temperature": 0}, {"seed": 7}])
def test_a_deterministic_request_is_not_regenerated(stack: InprocProxy, deterministic: dict[str, Any]) -> None:
    r = post(stack, "/v1/chat/completions", chat_body(**deterministic))
    assert r.status_code == 502
    found = rows(stack.extra["db"], r.headers["x-tapfix-capture-id"], 1, timeout=1.0)
    assert [row["attempt"] for row in found] == [1]
    skips = [c for c in found[0]["changes"] if c["kind"] == "skip"]
    assert [json.loads(c["after"]) for c in skips] == ["deterministic"], found[0]["changes"]
    assert "regenerated" not in json.loads(found[0]["flags"])


@pytest.mark.parametrize(
    "stack", [("break_args_first_attempt", "--regenerate", "1", "--tool-repair", "fail_fast")], indirect=True
)
def test_fail_fast_regenerates_too(stack: InprocProxy) -> None:
    r = post(stack, "/v1/chat/completions", chat_body())
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
    regenerated_once(stack.extra["db"], r.headers["x-tapfix-capture-id"])


@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "1")], indirect=True)
def test_captures_list_and_stats_count_one_client_request(stack: InprocProxy) -> None:
    r = post(stack, "/v1/chat/completions", chat_body())
    assert r.status_code == 200
    capture_id = r.headers["x-tapfix-capture-id"]
    db = stack.extra["db"]
    rows(db, capture_id, 2)
    listed = cli("captures", "list", "--db", str(db), "--json", "--flag", "regenerated")
    assert listed.returncode == 0, listed.stderr
    got = [orjson.loads(line) for line in listed.stdout.splitlines()]
    assert [(g["attempt_of"], g["attempt"]) for g in got] == [(None, 1), (capture_id, 2)]
    assert got[0]["id"] == capture_id
    stats = StoreLocator.of(db).backend().browse(search=False).compute_stats(Filters())
    assert (stats.total, stats.attempts) == (1, 1)


# -- timing: a slow attempt 2 holds no other client, and a client that leaves lets go of it ----------
SLOW_S = 4.0


@pytest.mark.parametrize("stack", [(slow_second_attempt(SLOW_S), "--regenerate", "1")], indirect=True)
def test_a_slow_attempt_2_holds_no_other_client(stack: InprocProxy) -> None:
    got: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: got.append(post(stack, "/v1/chat/completions", chat_body())))
    t0 = time.monotonic()
    waiting.start()
    try:
        time.sleep(1.0)  # attempt 1 answered, attempt 2 awaited
        other = httpx.post(stack.url + "/v1/chat/completions", json=plain_body(), timeout=5)
        assert other.status_code == 200 and time.monotonic() - t0 < SLOW_S, "served while attempt 2 was awaited"
    finally:
        waiting.join(30)
    (r,) = got
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert time.monotonic() - t0 >= SLOW_S
    regenerated_once(stack.extra["db"], r.headers["x-tapfix-capture-id"], others=1)


LEAVE_S = 1.5  # the client's read timeout: it hangs up while attempt 2 is awaited
LEAVING_BODIES = {
    "/v1/chat/completions": chat_body(),
    "/v1/responses": {"model": "m", "input": PROMPT, "tools": [RESPONSES_WRITE]},
    "/v1/messages": {"model": "m", "max_tokens": 1000, "messages": messages(), "tools": [MESSAGES_WRITE]},
}


@pytest.mark.parametrize("path", list(LEAVING_BODIES))
@pytest.mark.parametrize("stack", [(slow_second_attempt(3 * SLOW_S), "--regenerate", "1")], indirect=True)
def test_a_client_leaving_during_attempt_2_cancels_it(stack: InprocProxy, path: str) -> None:
    """The pending attempt is cancelled within the 0.2 s close check, not when the mock would answer
    (12 s later); the mock did get it (asked again, the conversation is on its third attempt: 418). The
    records say the client left (issue 31, item 9): it received nothing (no status), and the cancelled
    attempt is no upstream error."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            stack.url + path, json={**LEAVING_BODIES[path], "stream": False}, timeout=httpx.Timeout(30, read=LEAVE_S)
        )
    db = stack.extra["db"]
    found = rows(db, parent_id(stack), 2)
    assert [(r["attempt"], r["status"]) for r in found] == [(1, None), (2, None)], "nobody received an answer"
    first, second = (set(json.loads(r["flags"])) for r in found)
    assert {"client_disconnected", "regenerated"} <= first and "upstream_error" not in first, first
    assert "client_disconnected" in second and "upstream_error" not in second, second
    assert "client disconnected" in found[0]["error"] and "client disconnected" in found[1]["error"]
    assert found[1]["duration_ms"] < (LEAVE_S + 1.5) * 1000, "cancelled when the client left"
    skips = [json.loads(c["after"]) for c in found[0]["changes"] if c["kind"] == "skip"]
    assert skips == ["client_gone"]
    again = post(stack, path, LEAVING_BODIES[path])
    assert again.status_code == 418, "the mock saw attempt 2 (this is the conversation's third ask)"
