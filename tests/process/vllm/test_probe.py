"""`tapfix probe` against the real vLLM: every verdict agrees with vLLM's own answer to the same request.

As in the realengine suite (tests/process/realengine/test_probe.py, whose helpers this uses): the probe records
each request it sends; each test takes those exact bytes from the probe's capture database, sends them
straight to vLLM, judges that answer with the probe's own judge functions, and the verdict the probe printed
must be the one the direct answer deserves, its detail saying what the judge (or vLLM) said. No directive is
in the probe's prompts, so the tiny model answers as it does on its own: reasoning, then "Hello!".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tapfix.proxy.probe import checks
from tapfix.proxy.probe.client import Answer
from tapfix.proxy.probe.judge import judge_text, judge_tool_call, scan_stream

from tests.process.realengine.test_probe import (
    MAX_TOKENS,
    ProbeRun,
    probe_agrees_through,
    reasoning_lengths,
    resend_to,
    run_probe,
    tools_detail_by_mode,
    user_text,
)
from tests.process.vllm.engine import MAX_MODEL_LEN, VllmServer
from tests.support.inproc import InprocProxy

pytestmark = [pytest.mark.vllm]


@pytest.fixture(scope="module")
def direct(vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> ProbeRun:
    return run_probe(vllm.url, tmp_path_factory.mktemp("probe") / "probe.db")


@pytest.fixture(scope="module")
def resend(vllm: VllmServer) -> Callable[[bytes], Answer]:
    return resend_to(vllm.url, 120)


def test_the_probe_lists_the_model_and_sends_the_requests_its_checks_build(direct: ProbeRun) -> None:
    assert direct.rows["models"]["status"] == "pass"
    assert [user_text(b) for b in direct.requests("completion")] == [checks.COMPLETION_PROMPT]
    assert [user_text(b) for b in direct.requests("streaming")] == [checks.STREAM_PROMPT]
    tools = [json.loads(b) for b in direct.requests("tools")]
    assert [(t["stream"], t["tools"]) for t in tools] == [(False, [checks.TOOL]), (True, [checks.TOOL])]
    assert [user_text(b) for b in direct.requests("reasoning")] == [checks.REASONING_PROMPT] * 2
    assert direct.exit_code == 1  # the tiny model fails checks, so the probe's exit code says so


@pytest.mark.parametrize("check", ["completion", "streaming"])
def test_text_verdicts_are_the_judges_on_vllms_answer(direct: ProbeRun, resend, check: str) -> None:
    (body,) = direct.requests(check)
    answer = resend(body)
    assert answer.ok, answer.body
    problems = scan_stream(answer.chunks, answer.times).problems() if answer.stream else []
    if not problems:
        msg = answer.message()
        expect, label = (
            (checks.COMPLETION_EXPECT, checks.COMPLETION_LABEL)
            if check == "completion"
            else (checks.STREAM_EXPECT, checks.STREAM_LABEL)
        )
        problem = judge_text(msg.content, msg.reasoning, msg.finish_reason, MAX_TOKENS, expect, label)
        problems = [problem] if problem else []
    row = direct.rows[check]
    assert row["status"] == ("fail" if problems else "pass")
    assert problems and all(p in row["detail"] for p in problems)


def test_tools_verdict_is_what_vllms_answer_to_the_same_request_warrants(direct: ProbeRun, resend) -> None:
    said: dict[bool, str] = {}
    for body in direct.requests("tools"):
        answer = resend(body)
        stream = bool(json.loads(body)["stream"])
        assert answer.ok, answer.body
        msg = answer.message()
        problem = judge_tool_call(
            msg.tool_calls, msg.content, msg.finish_reason, checks.TOOL_NAME, checks.TOOL["function"]["parameters"]
        )
        assert problem, "the tiny model never calls the probe's tool on its own"
        said[stream] = problem
    row = direct.rows["tools"]
    assert row["status"] == "fail"
    by_mode = tools_detail_by_mode(row["detail"])
    for stream, words in said.items():
        assert words in by_mode.get(stream, ""), (stream, words, row["detail"])


def test_reasoning_verdict_counts_the_reasoning_vllm_returns(direct: ProbeRun, resend) -> None:
    """The probe asks with reasoning off and high; vLLM turns `reasoning_effort: "none"` into
    `enable_thinking: false`, so the first has none and the second the model's own."""
    lengths = reasoning_lengths(direct, resend)
    row = direct.rows["reasoning"]
    assert [row["data"]["none_chars"], row["data"]["high_chars"]] == lengths
    assert lengths[0] == 0 < lengths[1] and row["status"] == "pass"


def test_vision_fails_with_vllms_refusal(direct: ProbeRun, resend) -> None:
    (body,) = direct.requests("vision")
    answer = resend(body)
    assert answer.status == 400, "the tiny model is text only: vLLM must refuse the image"
    assert direct.rows["vision"]["status"] == "fail"
    assert answer.error_text() in direct.rows["vision"]["detail"]


def test_long_context_reports_the_prompt_vllm_counted(direct: ProbeRun, resend) -> None:
    (body,) = direct.requests("long_context")
    answer = resend(body)
    assert answer.ok, answer.body
    usage = answer.json()["usage"]
    row = direct.rows["long_context"]
    assert row["data"]["prompt_tokens"] == usage["prompt_tokens"] < MAX_MODEL_LEN
    assert row["status"] == "fail" and "not recalled" in row["detail"]  # the tiny model says "Hello!"


def test_through_tapfix_run_the_verdicts_are_the_same(direct: ProbeRun, tapfix_in_front, vllm, tmp_path: Path) -> None:
    proxy: InprocProxy = tapfix_in_front(vllm)
    probe_agrees_through(proxy, direct, tmp_path)
