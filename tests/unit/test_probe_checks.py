"""Every probe check against the in-process mock: healthy, and each shipped way of failing.

The mock runs as an ASGI app behind httpx's ASGITransport (no sockets, no processes), so the whole
matrix takes a second; tests/inproc/test_probe_cli.py drives the same through real processes.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.mock import MockOptions, create_app
from tapfix.proxy.probe import ALL_CHECKS, CHEAP_CHECKS, ProbeOptions, ProbeReport, run_probe

URL = "http://mock.test"


def probe(scenario: str | None = None, model: str | None = None, **kw) -> tuple[ProbeReport, list[Exchange]]:
    app = create_app(MockOptions(scenario=scenario))
    seen: list[Exchange] = []
    report = asyncio.run(run_probe(URL, model, transport=httpx.ASGITransport(app=app), capture=seen.append, **kw))
    return report, seen


def rows(report: ProbeReport) -> dict[str, tuple[str, str]]:
    return {r.check: (r.status, r.detail) for r in report.results}


def test_healthy_mock_passes_every_check():
    report, seen = probe()
    got = rows(report)
    assert list(got) == list(ALL_CHECKS)
    assert all(status == "pass" for status, _ in got.values()), got
    assert report.ok and report.exit_code == 0 and report.model == "tapfix-mock"
    assert "The capital of France is Paris." in got["completion"][1]
    # ASGITransport hands the body over in one piece: no decode rate in-process (see test_probe_cli).
    assert re.search(r"TTFT \d+ ms, (\d+ tok/s decode|decode rate n/a) \(\d+ tokens", got["streaming"][1])
    assert "write_file(" in got["tools"][1] and "streamed and non-streamed" in got["tools"][1]
    assert re.fullmatch(r"none=0 chars, high=\d+ chars", got["reasoning"][1])
    assert "red" in got["vision"][1]
    assert "passphrase recalled at depth 0.5 of ~2000 tokens" in got["long_context"][1]
    assert got["sampling"][1].startswith("no policy: tapfix injects nothing")
    streaming = report.result("streaming")
    assert streaming is not None and streaming.data["ttft_ms"] is not None and streaming.data["tokens"] > 10
    # Every request was handed to the capture, tagged probe and probe:<check>.
    assert all("probe" in ex.tags for ex in seen)
    assert {t for ex in seen for t in ex.tags} >= {f"probe:{c}" for c in ALL_CHECKS if c != "sampling"}
    assert all(r.captures for r in report.results if r.check != "sampling")
    as_dict = report.as_dict()
    assert as_dict["ok"] is True and {"check", "status", "ms", "detail"} <= set(as_dict["results"][0])


def test_cheap_checks_only():
    report, _ = probe(checks=CHEAP_CHECKS)
    assert [r.check for r in report.results] == ["models", "completion", "streaming"]
    assert report.ok


@pytest.mark.parametrize(
    ("scenario", "check", "detail"),
    [
        ("probe_failures/ignore_images", "vision", r"^the answer ignored the image: \"I don't see an image"),
        (
            "probe_failures/forget_needle",
            "long_context",
            r"^the passphrase planted at depth 0\.5 of ~2000 tokens "
            r"was not recalled, prompt_tokens \d+: 'I could not find a passphrase",
        ),
        (
            "probe_failures/ignore_effort",
            "reasoning",
            r"^reasoning length did not change with effort: none=(\d+) chars, high=\1 chars$",
        ),
        (
            "probe_failures/broken_tool_args",
            "tools",
            r"^tool call arguments are not valid JSON: Unterminated string "
            r"starting at \(char \d+\): '\{\"path\": \"hello.txt\", \"content\": \"Hel.*' "
            r"\(finish_reason length\) "
            r"\(streamed and non-streamed\)$",
        ),
        (
            "probe_failures/cjk_drift",
            "completion",
            r"^the answer drifts out of English into CJK script after \d+ "
            r"chars: '.*Paris\. The answer is 因为",
        ),
        ("probe_failures/cjk_drift", "streaming", r"^the answer drifts out of English into CJK script"),
        (
            "probe_failures/repeat_loop",
            "completion",
            r"^the answer loops: 'I will now check the file again.*' "
            r"repeated \d+ times \(finish_reason length\)$",
        ),
        (
            "probe_failures/runaway",
            "completion",
            r"^the answer did not end within 512 tokens \(finish_reason length\)",
        ),
        ("probe_failures/empty", "completion", r"^the answer is empty \(finish_reason stop"),
        ("probe_failures/empty", "streaming", r"the stream carried no content"),
    ],
)
def test_each_failure_is_caught_with_an_actionable_detail(scenario, check, detail):
    report, _ = probe(scenario)
    result = report.result(check)
    assert result is not None
    assert result.status == "fail", result
    assert re.search(detail, result.detail), result.detail
    assert report.exit_code == 1


def test_only_the_broken_ability_fails():
    """A scenario that breaks one ability must not make the others fail (no false alarms)."""
    for scenario, broken in [
        ("probe_failures/ignore_images", "vision"),
        ("probe_failures/forget_needle", "long_context"),
        ("probe_failures/ignore_effort", "reasoning"),
        ("probe_failures/broken_tool_args", "tools"),
    ]:
        report, _ = probe(scenario)
        assert [r.check for r in report.failed()] == [broken], (scenario, rows(report))


def test_wrong_model_ids():
    report, _ = probe("wrong_model_ids", model="tapfix-mock", checks=["models", "completion"])
    got = rows(report)
    assert got["models"] == (
        "fail",
        "model 'tapfix-mock' is not served; /v1/models lists: Qwen/Qwen3-30B-A3B-Instruct-2507, "
        "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    )
    assert got["completion"] == ("fail", "HTTP 404: The model `tapfix-mock` does not exist.")


def test_wrong_model_ids_suggests_the_close_id():
    report, _ = probe("wrong_model_ids", model="Qwen/Qwen3-30B-A3B", checks=["models"])
    assert rows(report)["models"][1].endswith("did you mean 'Qwen/Qwen3-30B-A3B-Instruct-2507'?")


def test_without_model_the_first_listed_is_probed():
    report, seen = probe("wrong_model_ids", checks=["models", "completion"])
    assert report.model == "Qwen/Qwen3-30B-A3B-Instruct-2507" and report.ok
    assert rows(report)["models"][1].startswith("'Qwen/Qwen3-30B-A3B-Instruct-2507' is served (the first listed")
    assert seen[-1].model == "Qwen/Qwen3-30B-A3B-Instruct-2507"


def test_needle_size_and_depth_are_configurable():
    report, seen = probe(checks=["long_context"], options=ProbeOptions(needle_tokens=6000, needle_depth=0.1))
    assert rows(report)["long_context"][0] == "pass"
    assert "depth 0.1 of ~6000 tokens" in rows(report)["long_context"][1]
    body = seen[-1].request.decode()
    assert 20_000 < len(body) < 30_000
    assert body.index("The passphrase is") < len(body) * 0.2


def test_needle_larger_than_the_context_is_refused():
    report, _ = probe(checks=["long_context"], options=ProbeOptions(needle_tokens=40_000))
    status, detail = rows(report)["long_context"]
    assert status == "fail"
    assert detail == "--needle-tokens 40000 does not fit the model's context (max_model_len 32768); use at most 32512"


def test_http_errors_are_reported_with_the_servers_words(tmp_path):
    scenario = tmp_path / "vision_400.json"
    scenario.write_text(
        '{"rules": [{"when": {"has_images": true}, "do": "http_error", "status": 400, "body": '
        '{"error": {"message": "Qwen3-8B is not a multimodal model", "type": "BadRequestError", '
        '"code": 400}}}]}'
    )
    report, _ = probe(str(scenario), checks=["vision"])
    assert rows(report)["vision"] == (
        "fail",
        "the server rejected the image: HTTP 400: Qwen3-8B is not a multimodal model",
    )


def test_a_malformed_stream_is_caught(tmp_path):
    scenario = tmp_path / "bad_stream.json"
    scenario.write_text('{"rules": [{"when": {"stream": true}, "do": "malformed_sse", "kind": "invalid_utf8"}]}')
    report, _ = probe(str(scenario), checks=["streaming"])
    status, detail = rows(report)["streaming"]
    assert status == "fail" and detail.startswith("event 3 is not JSON"), detail


def test_unknown_check_is_a_value_error():
    with pytest.raises(ValueError, match="unknown check bogus; expected some of models, completion"):
        asyncio.run(run_probe(URL, None, checks=["bogus"]))
