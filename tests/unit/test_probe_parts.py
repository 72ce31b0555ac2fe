"""The probe's pieces on plain inputs: images, needle text, stream scanning, answer judging."""

from __future__ import annotations

import base64

from tapfix.proxy.mock.vision import decode_data_url, dominant_colour
from tapfix.proxy.probe import images, needle
from tapfix.proxy.probe.judge import judge_text, judge_tool_call, scan_stream
from tapfix.proxy.probe.report import CheckResult, ProbeReport, render

from tests.support.builders import sse_events

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
    "additionalProperties": False,
}


def test_solid_png_is_a_valid_png_of_that_colour():
    for name in images.COLOURS:
        url = images.colour_png(name)
        assert url.startswith("data:image/png;base64,")
        png = base64.b64decode(url.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and png.endswith(b"IEND\xaeB`\x82")
        assert dominant_colour(decode_data_url(url)) == name


def test_haystack_size_depth_and_recall():
    secret = needle.new_passphrase()
    for depth in (0.0, 0.5, 1.0):
        text = needle.haystack(1000, depth, secret)
        assert 3900 < len(text) < 4300
        at = text.index(needle.needle_sentence(secret)) / len(text)
        assert abs(at - depth) < 0.05
        assert "passphrase" not in text.replace(needle.needle_sentence(secret), "")
    assert needle.recalled(f'The passphrase is "{secret}".', secret)
    assert needle.recalled(secret.upper().replace("-", " "), secret)
    assert not needle.recalled("I could not find it.", secret)


def test_judge_text():
    assert judge_text("The capital of France is Paris.", "", "stop", 512, r"\bparis\b", "Paris") is None
    assert judge_text("<think>hmm</think>Paris.", "", "stop", 512, r"\bparis\b", "Paris") is None
    assert judge_text("", "long thoughts", "length", 512) == (
        "no answer: all 512 tokens went to reasoning (finish_reason length)"
    )
    assert judge_text("Lyon is lovely.", "", "stop", 512, r"\bparis\b", "Paris") == (
        "the answer does not say Paris: 'Lyon is lovely.'"
    )


def test_scan_stream_well_formed_and_timed():
    chunks = sse_events(
        [
            b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
            b'{"choices":[{"index":0,"delta":{"content":"1,"}}]}',
            b'{"choices":[{"index":0,"delta":{"content":" 2"}}]}',
            b'{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}',
            b'{"choices":[],"usage":{"completion_tokens":3}}',
        ]
    ) + [b": ping\n\n"]
    scan = scan_stream(chunks, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    assert scan.problems() == []
    assert scan.ttft_ms == 200.0 and scan.tokens == 3 and scan.tokens_per_s == 20.0


def test_scan_stream_problems():
    chunks = sse_events([b'{"choices":[{"index":0,"delta":{"content":"hi"}}]}', b"{not json"], done=False)
    chunks += [b'data: {"x']
    problems = scan_stream(chunks, [0.1, 0.2, 0.3]).problems()
    assert problems[0].startswith("event 2 is not JSON")
    assert "the stream ended inside an event: 'data: {\"x'" in problems
    assert "the stream did not end with data: [DONE]" in problems
    assert "no finish_reason in any event" in problems
    error = sse_events([b'{"error":{"message":"upstream exploded","code":500}}'])
    assert "the stream carried an error: upstream exploded" in scan_stream(error, [0, 0]).problems()


def test_judge_tool_call():
    ok = [{"name": "write_file", "arguments": '{"path": "a.txt"}'}]
    assert judge_tool_call(ok, "", "tool_calls", "write_file", SCHEMA) is None
    assert judge_tool_call(ok, "", "stop", "write_file", SCHEMA) is None  # named tool_choice on vLLM
    bad = [{"name": "write_file", "arguments": '{"path": "a.txt" "x": 1}'}]
    assert judge_tool_call(bad, "", "tool_calls", "write_file", SCHEMA).startswith(
        "tool call arguments are not valid JSON: Expecting ',' delimiter (char 17)"
    )
    extra = [{"name": "write_file", "arguments": '{"path": "a.txt", "mode": 1}'}]
    assert judge_tool_call(extra, "", "tool_calls", "write_file", SCHEMA) == (
        "tool call arguments do not match the schema: Additional properties are not allowed ('mode' was unexpected)"
    )
    assert judge_tool_call([], '<tool_call>{"name": "write_file"}', "stop", "write_file", SCHEMA).startswith(
        "no tool call (the call leaked into the content: is the tool-call parser set?)"
    )
    other = [{"name": "bash", "arguments": "{}"}]
    assert judge_tool_call(other, "", "tool_calls", "write_file", SCHEMA) == "called 'bash' instead of 'write_file'"


def test_render_table_and_exit_codes():
    report = ProbeReport(
        "http://x",
        "m",
        [
            CheckResult("models", "pass", 3, "ok [brackets] stay"),
            CheckResult("vision", "fail", 1200, "the answer ignored the image"),
        ],
    )
    text = render(report)
    assert "ok [brackets] stay" in text and "FAIL" in text and "1 passed, 1 failed, 0 skipped" in text
    assert report.exit_code == 1
    assert ProbeReport("http://x", unreachable="no").exit_code == 2
    assert ProbeReport("http://x", results=[CheckResult("reasoning", "skip", 0, "")]).exit_code == 0
