"""Where each turn's prompt stopped matching the one before, through the real proxy: real SDKs send a
conversation turn by turn to `tapfix run`; a loopback upstream of the test's own answers; the capture's
`prefix_break` (`captures show --json`) and its line in `captures show` say where and why."""

from __future__ import annotations

import json
from importlib.resources import files

import anthropic
import httpx
import openai
import pytest
from jsonschema import Draft202012Validator

from tests.inproc.test_e2e_metrics import scrape_until, total
from tests.support.builders import messages_answer
from tests.support.inproc import cli, start_proxy
from tests.support.procs import wait_capture
from tests.support.rawserver import RawServer, json_reply


def _ok(body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    return json_reply(data)


MESSAGE = messages_answer()
CHAT = {
    "id": "c1",
    "object": "chat.completion",
    "model": "qwen3",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 120, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 96}},
}
LINE = "x-anthropic-billing-header: cc_version=2.1.332.{}; cc_entrypoint=sdk-cli;"
PROMPT = "You are Claude Code, Anthropic's official CLI for Claude."
SCHEMA = Draft202012Validator(json.loads((files("tapfix.schemas") / "capture.schema.json").read_text()))


@pytest.fixture
def upstream():
    server = RawServer(lambda request: [(0.0, _ok(CHAT if b"chat/completions" in request.head else MESSAGE))])
    yield server
    server.close()


def _shown(db, capture_id):
    wait_capture(db, capture_id)
    found = json.loads(cli("captures", "show", capture_id, "--db", str(db), "--json").stdout)
    SCHEMA.validate(found)
    return found, cli("captures", "show", capture_id, "--db", str(db)).stdout.decode()


def _claude_code_run(tmp_path, upstream, *args):
    """Three Claude-Code-shaped turns of one session; the third's billing line has another suffix (a new
    `cc_version` build, or a `cch` recomputed). `cache_control` moves to the last message every turn."""
    tmp_path.mkdir()
    db = tmp_path / "c.db"
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "vllm", *args, db=db)
    try:
        client = anthropic.Anthropic(
            base_url=proxy.url, api_key="k", max_retries=0, default_headers={"x-claude-code-session-id": "cc-1"}
        )
        history: list[dict[str, object]] = []
        shown = []
        for suffix, said in (("4e6", "fix the failing test"), ("4e6", "go on"), ("a1f", "and the docs")):
            history.append({"role": "user", "content": [{"type": "text", "text": said}]})
            messages = [dict(m) for m in history]
            last = messages[-1]["content"][0]  # type: ignore[index]
            messages[-1] = {"role": "user", "content": [{**last, "cache_control": {"type": "ephemeral"}}]}
            system = [{"type": "text", "text": LINE.format(suffix)}, {"type": "text", "text": PROMPT}]
            raw = client.messages.with_raw_response.create(
                model="qwen3",
                max_tokens=8000,
                system=system,  # type: ignore[arg-type]
                messages=messages,  # type: ignore[arg-type]
            )
            assert raw.parse().content[0].text == "ok"
            history.append({"role": "assistant", "content": [{"type": "text", "text": "ok"}]})
            shown.append(raw.headers["x-tapfix-capture-id"])
        turns = [_shown(db, c) for c in shown]
        metrics = scrape_until(proxy, 3)
        health = httpx.get(f"{proxy.url}/tapfix/health").json()["capture_writer"]
        return turns, metrics, health
    finally:
        proxy.stop()


def test_claude_codes_billing_line_kept_is_the_break_and_stripped_is_none(tmp_path, upstream):
    turns, metrics, health = _claude_code_run(tmp_path / "kept", upstream, "--keep-billing-line")
    (one, _), (two, shown2), (three, shown3) = turns
    assert one["prefix_break"] is None and two["prefix_break"] is None
    assert "prefix: no break" in shown2
    found = three["prefix_break"]
    assert (found["path"], found["cause"], found["previous"], found["body"]) == (
        "$.system[0].text",
        "billing_line",
        two["id"],
        "request",
    )
    request = three["bodies"]["request"]["text"].encode()
    assert request[found["offset"] : found["offset"] + 3] == b"a1f"  # the byte the suffix changed at
    assert f"prefix break at $.system[0].text, byte {found['offset']}" in shown3 and "billing_line" in shown3

    assert health["prefix_breaks"] == {"billing_line": 1} and health["request_changes"] == {}
    assert total(metrics, "tapfix_prefix_breaks_total", cause="billing_line", surface="messages") == 1
    assert total(metrics, "tapfix_prefix_breaks_total") == 1

    turns, metrics, health = _claude_code_run(tmp_path / "stripped", upstream)
    assert [t["prefix_break"] for t, _ in turns] == [None, None, None]
    assert all("strip_billing_line" in [c["kind"] for c in t["changes"]] for t, _ in turns)
    assert health["prefix_breaks"] == {} and health["request_changes"] == {"strip_billing_line": 3}
    assert total(metrics, "tapfix_request_changes_total", kind="strip_billing_line") == 3
    assert total(metrics, "tapfix_prefix_breaks_total") == 0


def test_a_chat_client_that_rewrites_its_system_prompt(tmp_path, upstream):
    """The openai SDK, no session id: turns 1-2 extend; turn 3 edits the system prompt and is still compared
    with turn 2 (the same client). The engine's cached prompt tokens are shown beside it."""
    db = tmp_path / "c.db"
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "vllm", db=db)
    try:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
        system = {"role": "system", "content": "You are a terse coding agent. Answer in one line."}
        history: list[dict[str, str]] = []
        ids = []
        for said in ("hi", "fix it", "thanks"):
            history.append({"role": "user", "content": said})
            if said == "thanks":
                system = {"role": "system", "content": "You are a terse coding agent. Answer in two lines."}
            raw = client.chat.completions.with_raw_response.create(model="qwen3", messages=[system, *history])  # type: ignore[list-item]
            history.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})
            ids.append(raw.headers["x-tapfix-capture-id"])
        (one, _), (two, shown2), (three, shown3) = [_shown(db, c) for c in ids]
    finally:
        proxy.stop()
    assert one["prefix_break"] is None and two["prefix_break"] is None
    found = three["prefix_break"]
    assert (found["path"], found["cause"], found["previous"]) == ("$.messages[0].content", "system_edited", two["id"])
    request = three["bodies"]["request"]["text"].encode()
    assert request[found["offset"] : found["offset"] + 9] == b"two lines"
    assert "one lines"[:3] in found["old"] and "two lines" in found["new"]
    assert two["cached_prompt_tokens"] == 96
    assert "96 of 120 prompt tokens from cache" in shown2
