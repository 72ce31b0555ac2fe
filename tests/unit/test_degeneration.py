"""The degeneration detectors: tables of answers that must (and must not) be flagged, never a raise."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.assemble.degeneration import (
    latin_dominant,
    repetition_loop,
    request_language,
    script_drift,
    tool_call_problems,
)
from tapfix.proxy.assemble.flags import response_flags
from tapfix.proxy.assemble.result import Assembled
from tapfix.proxy.mock.degenerate import degenerate_reply

from tests.support.builders import tool
from tests.support.depth import examples

CJK = "配置文件需要更新以便系统能够正确加载模型参数然后我们再检查输出结果是否符合预期因此我们应该先确认环境变量"
ENGLISH = (
    "The configuration file needs a small update so that the loader picks up the model "
    "parameters correctly. After that, run the tests again and compare the output. "
)
CODE = "\n".join(
    f"def handler_{i}(request):\n    value = request.get('field_{i}')\n    return value * {i}\n" for i in range(40)
)
TABLE = "| name | type | default |\n| --- | --- | --- |\n" + "".join(
    f"| option_{i} | int | {i * 3} |\n" for i in range(60)
)
WRITE_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
    "additionalProperties": False,
}
TOOLS = [tool("write", parameters=WRITE_SCHEMA)]


@pytest.mark.parametrize(
    ("text", "conversation_latin", "expected"),
    [
        (ENGLISH + "The answer is 因为 " + CJK, None, True),  # the mock's cjk_drift shape
        (degenerate_reply("cjk_drift", "Hello there. Fine.", 400).content, None, True),
        (ENGLISH * 3, None, False),
        (CJK * 3, None, False),  # a Chinese answer (to a Chinese conversation) is not drift
        (CJK * 3, True, True),  # ... but it is in an English conversation
        (ENGLISH + CJK * 3, False, False),  # a Chinese conversation may mix
        (ENGLISH + "In Chinese: 你好，世界。 That means hello world.", None, False),  # a short quote
        (ENGLISH + "한국어 " * 2, None, False),
        (
            ENGLISH + ("설정 파일을 업데이트해야 합니다 그리고 다시 실행하세요 " * 4),
            None,
            True,
        ),  # hangul, spaced
        (
            ENGLISH + "日本語のテキストがここに長く続いていますので注意してくださいこれは検出されるべきです",
            None,
            True,
        ),  # kana
        ("", None, False),
    ],
)
def test_script_drift(text: str, conversation_latin: bool | None, expected: bool) -> None:
    assert script_drift(text, conversation_latin=conversation_latin) is expected


def test_drift_made_of_short_runs_between_latin_words() -> None:
    mixed = ENGLISH + " ".join(f"{CJK[i : i + 20]} ok" for i in range(0, 40, 2))
    assert script_drift(mixed)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (degenerate_reply("repeat_loop", "", 400).content, True),
        (degenerate_reply("repeat_loop", "", 100).content, True),
        ("I will check the file. " * 60, True),  # a sentence loop without newlines
        ("!" * 500, True),
        (CJK[:12] * 50, True),  # a CJK loop: no spaces, characters are the tokens
        (ENGLISH + "Let me verify that again.\n" * 3, False),
        (ENGLISH * 2, False),
        (CODE, False),
        (TABLE, False),
        ("short", False),
        ("", False),
    ],
)
def test_repetition_loop(text: str, expected: bool) -> None:
    assert repetition_loop(text) is expected


@pytest.mark.parametrize(
    ("arguments", "tools", "problem"),
    [
        ('{"path": "a.txt", "content": "hi"}', TOOLS, None),
        ('{"path": "a.txt"}', TOOLS, "'content' is a required property"),
        ('{"path": "a.txt", "content": 3}', TOOLS, "3 is not of type 'string'"),
        ('{"path": "a.txt", "content": "x"', TOOLS, "not JSON"),
        ('["a.txt"]', None, "not a JSON object"),
        ('{"path": "a.txt"}', None, None),  # no tools given: syntax only
        ("", [{"type": "function", "function": {"name": "write", "parameters": {"type": "object"}}}], None),
        (
            '{"x": 1}',
            [{"type": "function", "function": {"name": "write", "parameters": {"type": "bogus"}}}],
            None,
        ),
    ],
)
def test_tool_call_problems(arguments: str, tools: list | None, problem: str | None) -> None:
    problems = tool_call_problems([{"id": "c1", "name": "write", "arguments": arguments}], tools)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0]


def test_unknown_tool_and_other_tool_styles() -> None:
    assert "no such tool" in tool_call_problems([{"name": "delete", "arguments": "{}"}], TOOLS)[0]
    anthropic = [{"name": "write", "input_schema": {"type": "object", "required": ["path"]}}]
    assert tool_call_problems([{"name": "write", "arguments": "{}"}], anthropic)
    responses = [{"type": "function", "name": "write", "parameters": {"type": "object"}}]
    assert tool_call_problems([{"name": "write", "arguments": "{}"}], responses) == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"messages": [{"role": "system", "content": "\xe4\xbd\xa0\xe5\xa5\xbd"}, '
            b'{"role": "user", "content": "Please fix the failing test in the parser module"}]}',
            True,
        ),
        (
            '{"messages": [{"role": "user", "content": "请修复解析器模块中失败的测试用例谢谢"}]}'.encode(),
            False,
        ),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "Fix the parser tests"}]}]}',
            True,
        ),
        (b'{"input": "Summarise the design document in three lines"}', True),
        (b"not json", None),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', None),
    ],
)
def test_request_language(body: bytes, expected: bool | None) -> None:
    assert request_language(body) is expected


def test_latin_dominant_needs_enough_letters() -> None:
    assert latin_dominant("ok") is None and latin_dominant(ENGLISH) is True and latin_dominant(CJK) is False


def _assembled(content: str = "", **kw) -> Assembled:
    return Assembled(content=content, finish_reason=kw.pop("finish_reason", "stop"), done=True, events=3, **kw)


@pytest.mark.parametrize(
    ("assembled", "kwargs", "expected"),
    [
        (_assembled(ENGLISH), {}, set()),
        (_assembled(ENGLISH + "因为 " + CJK), {}, {"script_drift"}),
        (
            _assembled(CJK * 2),
            {"request_body": b'{"messages":[{"role":"user","content":"Explain the error please"}]}'},
            {"script_drift"},
        ),
        (_assembled(CJK * 2), {}, set()),
        (
            _assembled(degenerate_reply("repeat_loop", "", 400).content, finish_reason="length"),
            {},
            {"repetition_loop", "runaway_length"},
        ),
        (
            _assembled("", tool_calls=[{"id": "1", "name": "write", "arguments": '{"path": 1}'}]),
            {"tools": TOOLS},
            {"invalid_tool_call"},
        ),
        (
            _assembled("", tool_calls=[{"id": "1", "name": "write", "arguments": '{"path": "a", "content": ""}'}]),
            {"tools": TOOLS},
            set(),
        ),
        (
            _assembled(
                "",
                reasoning="Let me think about this carefully. "
                + "我们需要检查配置文件是否正确然后再继续下一步的处理工作并确认输出结果符合预期",
            ),
            {},
            {"script_drift"},
        ),
        (_assembled(""), {}, {"empty_answer"}),
    ],
)
def test_response_flags(assembled: Assembled, kwargs: dict, expected: set[str]) -> None:
    assert response_flags(assembled, 200, True, **kwargs) == expected


def test_error_responses_get_no_degeneration_flags() -> None:
    assert response_flags(_assembled("!" * 500), 500, False) == set()
    assert response_flags(_assembled("!" * 500), None, False) == set()


@settings(max_examples=examples(300), deadline=None)
@given(st.text(), st.text(max_size=200), st.booleans())
def test_detectors_never_raise(text: str, request_text: str, latin: bool) -> None:
    script_drift(text)
    script_drift(text, conversation_latin=latin)
    repetition_loop(text)
    latin_dominant(text)
    message = {"messages": [{"role": "user", "content": request_text}]}
    body = json.dumps(message).encode()
    response_flags(_assembled(text, reasoning=request_text), 200, True, request_body=body, tools=TOOLS)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["name", "arguments", "id"]),
            st.one_of(st.text(max_size=30), st.integers(), st.none()),
        ),
        max_size=4,
    ),
    st.one_of(st.none(), st.just(TOOLS), st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=5)))),
)
def test_tool_call_problems_never_raises(calls: list, tools: list | None) -> None:
    assert isinstance(tool_call_problems(calls, tools), list)


@given(st.binary(max_size=300))
def test_request_language_never_raises(body: bytes) -> None:
    request_language(body)


def test_detectors_are_linear_and_cheap() -> None:
    """They run in the writer thread for every capture: a megabyte answer costs milliseconds."""
    huge = (ENGLISH + CODE + TABLE) * 200 + ENGLISH  # ~1.4 MB of healthy text
    loop = "I will now check the file again to make sure the change is correct.\n" * 20000
    for text in (huge, loop, CJK * 20000):
        started = time.perf_counter()
        response_flags(_assembled(text, reasoning=text[:100_000]), 200, True)
        assert time.perf_counter() - started < 0.5
