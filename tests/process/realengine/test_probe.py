"""`tapfix probe` against a real llama-server: every verdict agrees with the server's own answer.

The probe records each request it sends (tagged `probe:<check>`). Each test takes those exact bytes
from the probe's capture database, sends them straight to llama-server with httpx, and judges that
answer with the probe's own judge functions: the verdict the probe printed must be the one the direct
answer deserves, and its detail must say what the judge (or the server) said. Requests are first
checked to be the ones the checks build (their prompts and tool come from proxy/probe/checks.py).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from tapfix.proxy.probe import checks
from tapfix.proxy.probe.client import Answer
from tapfix.proxy.probe.judge import THINK, judge_text, judge_tool_call, scan_stream
from tapfix.proxy.probe.runner import ProbeOptions
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import capture_body, load_capture

from tests.support.inproc import InprocProxy, cli

pytestmark = [pytest.mark.realengine]

MAX_TOKENS = ProbeOptions().max_tokens  # what `tapfix probe` sends without options


@dataclass
class ProbeRun:
    """One `tapfix probe --json` run: its report rows by check, and its capture database."""

    rows: dict[str, dict[str, Any]]
    db: Path
    exit_code: int

    def requests(self, check: str) -> list[bytes]:
        """The bodies the check sent upstream, in order (as forwarded: the bytes the server got)."""
        conn: sqlite3.Connection = open_for_reading(self.db)
        try:
            return [capture_body(conn, load_capture(conn, cid), "forwarded") for cid in self.rows[check]["captures"]]
        finally:
            conn.close()


def run_probe(url: str, db: Path) -> ProbeRun:
    result = cli("probe", "--upstream", url, "--json", "--db", str(db))
    assert result.returncode in (0, 1), result.stdout.decode() + result.stderr.decode()
    report = json.loads(result.stdout)
    return ProbeRun({r["check"]: r for r in report["results"]}, db, result.returncode)


@pytest.fixture(scope="module")
def direct(llama, tmp_path_factory: pytest.TempPathFactory) -> ProbeRun:
    return run_probe(llama.url, tmp_path_factory.mktemp("probe") / "probe.db")


def resend_to(base_url: str, timeout: float) -> Callable[[bytes], Answer]:
    """Send probe bytes straight to a server, read back as the probe reads an answer. A client per
    request: llama-server closes idle keep-alive connections, and a reused one can meet the close."""

    def send(body: bytes) -> Answer:
        stream = bool(json.loads(body).get("stream"))
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        started = time.perf_counter()
        chunks: list[bytes] = []
        times: list[float] = []
        with (
            httpx.Client(base_url=base_url, timeout=timeout, trust_env=False) as client,
            client.stream("POST", checks.CHAT, content=body, headers=headers) as response,
        ):
            for chunk in response.iter_raw():
                chunks.append(chunk)
                times.append(time.perf_counter() - started)
        return Answer(
            response.status_code, list(response.headers.multi_items()), b"".join(chunks), stream, chunks, times
        )

    return send


@pytest.fixture(scope="module")
def resend(llama) -> Callable[[bytes], Answer]:
    return resend_to(llama.url, 30)


def user_text(body: bytes) -> Any:
    return json.loads(body)["messages"][0]["content"]


def test_every_request_the_probe_sent_is_one_its_checks_build(direct):
    assert [user_text(b) for b in direct.requests("completion")] == [checks.COMPLETION_PROMPT]
    assert [user_text(b) for b in direct.requests("streaming")] == [checks.STREAM_PROMPT]
    tools = [json.loads(b) for b in direct.requests("tools")]
    assert [(t["stream"], t["tools"], user_text(json.dumps(t).encode())) for t in tools] == [
        (False, [checks.TOOL], checks.TOOL_PROMPT),
        (True, [checks.TOOL], checks.TOOL_PROMPT),
    ]
    assert [user_text(b) for b in direct.requests("reasoning")] == [checks.REASONING_PROMPT] * 2
    assert user_text(direct.requests("vision")[0])[0]["text"] == checks.VISION_PROMPT
    assert direct.exit_code == 1  # the tiny model fails checks, so the probe's exit code says so


def test_completion_names_what_the_judge_finds_in_the_fixed_answer(direct, resend):
    (body,) = direct.requests("completion")
    answer = resend(body)
    assert answer.ok, answer.body
    msg = answer.message()
    problem = judge_text(
        msg.content, msg.reasoning, msg.finish_reason, MAX_TOKENS, checks.COMPLETION_EXPECT, checks.COMPLETION_LABEL
    )
    row = direct.rows["completion"]
    assert row["status"] == ("fail" if problem else "pass")
    assert problem is not None and problem in row["detail"]


def test_streaming_verdict_is_the_judges_on_the_real_stream(direct, resend):
    (body,) = direct.requests("streaming")
    answer = resend(body)
    assert answer.ok and "event-stream" in answer.content_type, answer.body
    problems = scan_stream(answer.chunks, answer.times).problems()
    if not problems:
        msg = answer.message()
        problem = judge_text(
            msg.content, msg.reasoning, msg.finish_reason, MAX_TOKENS, checks.STREAM_EXPECT, checks.STREAM_LABEL
        )
        problems = [problem] if problem else []
    row = direct.rows["streaming"]
    assert row["status"] == ("fail" if problems else "pass")
    assert all(p in row["detail"] for p in problems)


def test_tools_verdict_is_what_the_servers_answer_to_the_same_request_warrants(direct, resend):
    """The probe offers `write_file`; llama.cpp constrains the output with a grammar for it, and the
    tiny model only ever calls `write`. Whatever the server makes of that (an error, a stream that
    carries one, a call) is what the verdict and its detail must reflect, mode by mode."""
    problems: dict[bool, str | None] = {}
    said: dict[bool, str] = {}  # what the detail must quote: the server's error, or the judge's words
    for body in direct.requests("tools"):
        answer = resend(body)
        stream = bool(json.loads(body)["stream"])
        if not answer.ok:
            problems[stream] = said[stream] = answer.error_text()
            continue
        error = scan_stream(answer.chunks, answer.times).error if stream else None
        msg = answer.message()
        parameters = checks.TOOL["function"]["parameters"]
        problems[stream] = judge_tool_call(msg.tool_calls, msg.content, msg.finish_reason, checks.TOOL_NAME, parameters)
        if problems[stream]:
            said[stream] = error or problems[stream]
    row = direct.rows["tools"]
    assert row["status"] == ("fail" if any(problems.values()) else "pass"), (problems, row)
    by_mode = tools_detail_by_mode(row["detail"])
    for stream, words in said.items():
        mode = "streamed" if stream else "non-streamed"
        assert words in by_mode.get(stream, ""), f"{mode}: {words!r} not in {row['detail']!r}"


def tools_detail_by_mode(detail: str) -> dict[bool, str]:
    """The tools check's detail split into what it says of each mode (keyed by `stream`)."""
    both = " (streamed and non-streamed)"
    if detail.endswith(both):
        return {False: detail.removesuffix(both), True: detail.removesuffix(both)}
    if detail.startswith("non-streamed: "):
        plain, _, streamed = detail.removeprefix("non-streamed: ").partition("; streamed: ")
        return {False: plain, True: streamed}
    return {True: detail.removeprefix("streamed: ")}


def reasoning_lengths(direct: ProbeRun, resend: Callable[[bytes], Answer]) -> list[int]:
    """How much reasoning the server returns to each of the reasoning check's requests (its field or think tags)."""
    lengths = []
    for body in direct.requests("reasoning"):
        answer = resend(body)
        assert answer.ok, answer.body
        msg = answer.message()
        lengths.append(len(msg.reasoning) or len("".join(THINK.findall(msg.content))))
    return lengths


def test_reasoning_verdict_counts_the_reasoning_the_server_returns(direct, resend):
    lengths = reasoning_lengths(direct, resend)
    row = direct.rows["reasoning"]
    assert "data" in row, row
    assert [row["data"]["none_chars"], row["data"]["high_chars"]] == lengths
    expected = "skip" if lengths == [0, 0] else ("pass" if lengths[1] > lengths[0] else "fail")
    assert row["status"] == expected


def test_vision_fails_with_the_servers_refusal(direct, resend):
    (body,) = direct.requests("vision")
    answer = resend(body)
    row = direct.rows["vision"]
    assert not answer.ok, "the tiny model has no projector: llama-server must refuse the image"
    assert row["status"] == "fail"
    assert answer.error_text() in row["detail"]


def test_long_context_fails_quoting_the_overflow_error_and_its_token_counts(direct, resend):
    (body,) = direct.requests("long_context")
    answer = resend(body)
    assert answer.status == 400, "the needle prompt must overflow this server's context"
    error = answer.json()["error"]
    row = direct.rows["long_context"]
    assert row["status"] == "fail"
    assert error["type"] in row["detail"]
    for count in (error["n_prompt_tokens"], error["n_ctx"]):
        assert str(count) in row["detail"]
    assert answer.error_text() in row["detail"]


def probe_agrees_through(proxy: InprocProxy, direct: ProbeRun, tmp: Path) -> ProbeRun:
    """`tapfix probe` through tapfix gives the verdicts and exit code it gives straight to the server, and the
    details too, except streaming's timings and the needle's token count (its passphrase is random)."""
    proxied = run_probe(proxy.url, tmp / "probe.db")
    differing = [c for c in direct.rows if proxied.rows.get(c, {}).get("status") != direct.rows[c]["status"]]
    assert not differing, "\n".join(
        f"{c}: through tapfix {proxied.rows.get(c)!r}\n{' ' * len(c)}  straight {direct.rows[c]!r}" for c in differing
    )
    assert set(proxied.rows) == set(direct.rows)
    assert proxied.exit_code == direct.exit_code
    for check in ("completion", "tools", "reasoning", "vision"):
        assert proxied.rows[check]["detail"] == direct.rows[check]["detail"], check
    return proxied


def test_through_tapfix_run_the_verdicts_are_the_same(direct, llama_proxy: InprocProxy, tmp_path):
    proxied = probe_agrees_through(llama_proxy, direct, tmp_path)
    # Through tapfix the probe knows the window before sending: tapfix's /v1/models lists llama-server's n_ctx
    # as max_model_len (issue 37), so the needle that overflowed the server directly is refused up front.
    n_ctx = direct.rows["long_context"]["detail"].split("n_ctx ")[-1].split()[0].strip(",;)")
    assert f"does not fit the model's context (max_model_len {n_ctx})" in proxied.rows["long_context"]["detail"]
