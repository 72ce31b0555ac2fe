"""Claude Code (2.1.332, `claude -p`) through `tapfix run`'s `/v1/messages` in front of `tapfix mock`.

Claude Code sends a `role: "system"` message after the user's prompt; the mock once read that as the turn,
so `break_first_turn` never broke Claude Code and a test standing on it checked nothing. Here the first
turn really is cut (the store shows the upstream's `max_tokens` answer), and tapfix's regeneration gives
Claude Code the whole call: the file is written, never half. A tool that fails is reported as failed.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.agents import GREETING, PROMPT, RUN_TIMEOUT, FileWatcher, Sandbox, check_run, claude_result, start_claude

pytestmark = [pytest.mark.agents, pytest.mark.e2e]


def _event_payloads(body: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith(b"data: {")]


def test_claude_codes_broken_first_turn_is_regenerated_and_the_file_written(stack, tmp_path):
    s = stack(mock_args=["--scenario", "break_first_turn"])
    sandbox = Sandbox(tmp_path, "claude")
    with FileWatcher(sandbox.work / "hello.txt") as watch:
        run = start_claude(sandbox, s.base_url, PROMPT).wait(RUN_TIMEOUT)
    check_run(run, s)
    result = claude_result(run)
    assert not result["is_error"] and result["result"].startswith("Done."), run.describe()
    assert run.file("hello.txt").read_text() == GREETING
    assert [v for v in watch.seen if v] == [GREETING.encode()], "a half-written file existed"
    s.stop_proxy()

    rows = s.store.rows()
    assert all(r["path"].startswith("/v1/messages") for r in rows), rows
    first = next(r for r in rows if r["attempt_of"] is None)  # oldest first: the first turn
    assert "regenerated" in first["flags"], rows
    # The upstream really cut the first attempt (the scenario held for Claude Code's request) ...
    cut = _event_payloads(s.store.body(first["id"], "response"))
    assert [e["delta"]["stop_reason"] for e in cut if e["type"] == "message_delta"] == ["max_tokens"]
    # ... its retry is recorded beside it, and Claude Code got one whole call.
    (retry,) = [r for r in rows if r["attempt_of"] == first["id"]]
    assert retry["attempt"] == 2 and retry["finish_reason"] == "tool_use"
    delivered = _event_payloads(s.store.body(first["id"], "client_response"))
    args = "".join(e["delta"].get("partial_json", "") for e in delivered if e["type"] == "content_block_delta")
    assert json.loads(args) == {"file_path": str(sandbox.work / "hello.txt"), "content": GREETING}
    # The request that was broken is Claude Code's, with its system message after the prompt.
    body = s.store.json_body(first["id"])
    assert body["messages"][-1]["role"] == "system" and body["tools"], body["messages"][-1]


@pytest.mark.parametrize(
    "prompt, permission_mode, file",
    [
        # Headless, nobody grants the write: Claude Code refuses it (is_error, "haven't granted it yet").
        (PROMPT, "default", "hello.txt"),
        # Claude Code's Edit tool on a file that isn't there: "File does not exist."
        ("Fix the greeting in notes.txt", "acceptEdits", "notes.txt"),
    ],
)
def test_claude_code_is_told_a_failed_tool_call_failed(prompt, permission_mode, file, stack, tmp_path):
    s = stack()
    sandbox = Sandbox(tmp_path, "claude")
    run = start_claude(sandbox, s.base_url, prompt, permission_mode=permission_mode).wait(RUN_TIMEOUT)
    check_run(run, s)
    text = claude_result(run)["result"]
    assert "failed" in text and "Done" not in text and "created" not in text, run.describe()
    assert not run.file(file).exists()
    s.stop_proxy()

    turns = [r for r in s.store.rows() if r["attempt_of"] is None]
    assert [r["finish_reason"] for r in turns] == ["tool_use", "end_turn"], turns
    results = [
        block
        for m in s.store.json_body(turns[-1]["id"])["messages"]
        if isinstance(m["content"], list)
        for block in m["content"]
        if block.get("type") == "tool_result"
    ]
    assert results and results[-1].get("is_error") is True, results  # Claude Code flagged the failure
