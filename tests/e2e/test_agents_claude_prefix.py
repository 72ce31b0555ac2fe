"""Claude Code (2.1.332, `claude -p`) through `tapfix run --engine vllm` in front of `tapfix mock`: where each of
its turns' prompts stopped matching the one before (`captures show --json` field `prefix_break`).

Its billing line (`x-anthropic-billing-header: cc_version=2.1.332.<suffix>; ...`) keeps one suffix through a run,
so a run's turns extend each other whether tapfix strips the line or keeps it; what changes between runs is
the suffix, at byte 0 of everything an engine could reuse."""

from __future__ import annotations

import json
import re

import pytest
from tapfix.proxy.request.prefix_break import find_break, prompt_of

from tests.e2e.agents import GREETING, PROMPT, RUN_TIMEOUT, Sandbox, check_run, claude_result, start_claude
from tests.support.inproc import cli

pytestmark = [pytest.mark.agents, pytest.mark.e2e]


def _turns(s):
    """Claude Code's main-agent turns of the run (those that offered tools), oldest first, as `show --json`."""
    shown = [
        json.loads(cli("captures", "show", r["id"], "--db", str(s.store.db), "--json").stdout)
        for r in s.store.rows()
        if r["attempt_of"] is None and r["path"].startswith("/v1/messages")
    ]
    return [t for t in shown if json.loads(t["bodies"]["request"]["text"]).get("tools")]


@pytest.mark.parametrize("keep", [False, True], ids=["stripped", "kept"])
def test_claude_codes_turns_extend_each_other(keep, stack, tmp_path):
    s = stack(proxy_args=["--engine", "vllm", *(["--keep-billing-line"] if keep else [])])
    sandbox = Sandbox(tmp_path, "claude")
    run = start_claude(sandbox, s.base_url, PROMPT).wait(RUN_TIMEOUT)
    check_run(run, s)
    assert not claude_result(run)["is_error"], run.describe()
    assert run.file("hello.txt").read_text() == GREETING
    s.stop_proxy()

    turns = _turns(s)
    assert len(turns) >= 2, [t["id"] for t in turns]
    first = json.loads(turns[0]["bodies"]["request"]["text"])
    assert first["system"][0]["text"].startswith("x-anthropic-billing-header:")  # the client sent the line
    assert [t["prefix_break"] for t in turns] == [None] * len(turns), [t["prefix_break"] for t in turns]
    stripped = [any(c["kind"] == "strip_billing_line" for c in t["changes"]) for t in turns]
    assert stripped == [not keep] * len(turns)

    # Null means compared and extending: the engine's two prompts, read again, extend each other ...
    engine = [(t["bodies"]["forwarded"] or t["bodies"]["request"])["text"].encode() for t in turns[:2]]
    one, two = (prompt_of(json.loads(b), "messages") for b in engine)
    assert find_break(one, two, engine[1]) is None
    if keep:  # ... and the next run's suffix (another build) would break it at the line's byte.
        line = json.loads(engine[1])["system"][0]["text"]
        suffix = re.search(r"cc_version=[0-9.]+\.([0-9a-f]+);", line)
        assert suffix, line
        other = engine[1].replace(suffix.group(0).encode(), suffix.group(0).replace(suffix.group(1), "zzz").encode())
        found = find_break(one, prompt_of(json.loads(other), "messages"), other)
        assert found is not None and (found.path, found.cause) == ("$.system[0].text", "billing_line")
        assert other[found.offset : found.offset + 3] == b"zzz"
