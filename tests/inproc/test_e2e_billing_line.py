"""Claude Code's billing block through the real proxy: the anthropic SDK sends Claude Code's system prompt to
`/v1/messages`; a loopback upstream of the test's own records what reaches it."""

from __future__ import annotations

import json

import anthropic
import pytest

from tests.support.builders import messages_answer
from tests.support.inproc import cli, start_proxy
from tests.support.procs import wait_capture
from tests.support.rawserver import RawServer, json_reply

LINE = "x-anthropic-billing-header: cc_version=2.1.332.4e6; cc_entrypoint=sdk-cli; cch=1a2b3;"
# Claude Code 2.1.332's system prompt, shortened: the billing line, then the prompt blocks it marks for caching.
SYSTEM = [
    {"type": "text", "text": LINE},
    {
        "type": "text",
        "text": "You are Claude Code, Anthropic's official CLI for Claude.",
        "cache_control": {"type": "ephemeral"},
    },
    {
        "type": "text",
        "text": "\nYou are an interactive agent that helps users with software engineering tasks.",
        "cache_control": {"type": "ephemeral"},
    },
]
MESSAGE = messages_answer()
ANSWER = json.dumps(MESSAGE).encode()
OK = json_reply(ANSWER)


@pytest.fixture
def upstream():
    server = RawServer(lambda _: [(0.0, OK)])
    yield server
    server.close()


def _turn(tmp_path, upstream, *args):
    """One Claude-Code-shaped request through a proxy started with `args`: what the client sent, what the
    upstream received (parsed), and the capture as `tapfix captures show` prints it."""
    db = tmp_path / f"c{len(upstream.requests)}.db"
    proxy = start_proxy(tmp_path, upstream.url, *args, db=db)
    try:
        client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
        raw = client.messages.with_raw_response.create(
            model="qwen3",
            max_tokens=8000,
            system=SYSTEM,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "fix the failing test"}],
        )
        assert raw.parse().content[0].text == "ok"
        capture_id = raw.headers["x-tapfix-capture-id"]
        wait_capture(db, capture_id)
        sent = cli("captures", "export", capture_id, "--db", str(db)).stdout
        shown = cli("captures", "show", capture_id, "--db", str(db)).stdout.decode()
        return json.loads(sent), json.loads(upstream.requests[-1].body), upstream.requests[-1].body, shown
    finally:
        proxy.stop()


def test_a_local_engine_never_sees_claude_codes_billing_block(tmp_path, upstream):
    sent, received, raw, shown = _turn(tmp_path, upstream, "--engine", "vllm")
    assert sent["system"][0] == {"type": "text", "text": LINE}  # the client did send it
    assert received["system"] == SYSTEM[1:]
    assert LINE.encode() not in raw
    assert {k: v for k, v in received.items() if k != "system"} == {k: v for k, v in sent.items() if k != "system"}
    assert "strip_billing_line $.system[0]" in shown and LINE in shown


@pytest.mark.parametrize("args", [("--engine", "vllm", "--keep-billing-line"), ()], ids=["kept", "no-engine"])
def test_the_block_reaches_the_upstream_when_kept_or_the_engine_is_unknown(tmp_path, upstream, args):
    sent, received, raw, shown = _turn(tmp_path, upstream, *args)
    assert sent["system"][0] == {"type": "text", "text": LINE}
    assert received == sent
    assert "strip_billing_line" not in shown
