"""A repair fills in only what the evidence proves: where a dropped fragment would look the same, the
call fails with the retryable error instead of going out as a different call.

Each rule is tested both ways: the text a fragment drop leaves (which must fail), and the legitimate
defect of the same shape that still repairs.
"""

from __future__ import annotations

import json

import pytest
from tapfix.proxy.toolcalls.arguments import CUT, repair_arguments
from tapfix.proxy.toolcalls.defects import DUPLICATED, MISSING_FRAGMENT, MISSING_LAST_CHUNK
from tapfix.proxy.toolcalls.schema import ToolSchemas

from tests.support.builders import tool

GREP = tool("grep", {"pattern": {"type": "string"}, "path": {"type": "string"}}, ["pattern"])
WRITE = tool("write", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"])
READ = tool(
    "read",
    {"path": {"type": "string"}, "offset": {"type": "integer"}, "limit": {"type": "integer"}},
    ["path"],
)
LIST = tool(
    "list",
    {"path": {"type": "string"}, "recursive": {"type": "boolean"}, "globs": {"type": "array"}},
    ["path"],
)
NOTE = tool("note", {"q": {"type": "string"}, "r": {"type": "integer"}}, ["q"])
SHELL = tool("shell", {"command": {"type": "string"}}, ["command"])
BARE = tool("bare")  # declares no properties
TOOLS = ToolSchemas([GREP, WRITE, READ, LIST, NOTE, SHELL, BARE])
NO_TOOLS = ToolSchemas(None)


def repaired(frags: list[str], name: str | None) -> dict:
    result = repair_arguments(frags, name, TOOLS if name else NO_TOOLS)
    assert result.fatal is None, result.fatal
    return json.loads(result.text)


def failed(frags: list[str], name: str | None, finish: str | None = None) -> tuple[str, str]:
    result = repair_arguments(frags, name, TOOLS if name else NO_TOOLS, finish)
    assert result.fatal is not None, f"repaired to {result.text!r}"
    return result.fatal, result.kinds[0] if result.kinds else ""


# -- 1. a quote that could end the string ------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "name"),
    [
        ('{"pattern":"ls -la",README.md"}', "grep"),  # `"path":"` dropped
        ('{"q": "he said "hi", then left"}', "note"),  # reads the same as a drop after `"hi"`
        ('{"q": "he said "hi", then left"}', None),
        ('{"q": "ab""c"}', "note"),  # `, "x": ` dropped between two strings
        ('{"q": "a "b"", "r": 2}', "note"),  # a quote right after a quote
        ('{"q": "x" ,y"}', "note"),  # whitespace before the comma changes nothing
    ],
)
def test_a_quote_that_could_end_the_string_fails_the_call(text: str, name: str | None) -> None:
    reason, kind = failed([text], name)
    assert kind == MISSING_FRAGMENT
    assert "quote that could end the string" in reason


@pytest.mark.parametrize(
    ("text", "name", "expected"),
    [
        ('{"command": "echo "hi" now"}', "shell", {"command": 'echo "hi" now'}),
        ('{"q": "名字叫"3.14根毛"的", "r": 1}', "note", {"q": '名字叫"3.14根毛"的', "r": 1}),
        ('{"q": "say "x"y"}', "note", {"q": 'say "x"y'}),
        ('{"q": "a "b" c", "r": 2}', "note", {"q": 'a "b" c', "r": 2}),
    ],
)
def test_a_quote_followed_by_what_never_follows_a_string_is_inside_it(
    text: str, name: str | None, expected: dict
) -> None:
    assert repaired([text], name) == expected


# -- 2. a missing comma is a lost fragment -----------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "name"),
    [
        ('{"a": 1 "b": 2}', None),  # `5,` of `{"a": 15, "b": 2}` dropped
        ('{"q": "x" "r": 2}', "note"),
        ('{"globs": [1 2], "path": "a", "recursive": true}', "list"),
        ('{"globs": ["a", "b", 1ue], "path": "a", "recursive": true}', "list"),  # `, tr` of `1, true`
        ('{"globs": ["a" "b"], "path": "a", "recursive": true}', "list"),
    ],
)
def test_a_missing_comma_fails_the_call(text: str, name: str | None) -> None:
    _, kind = failed([text], name)
    assert kind == MISSING_FRAGMENT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1,\\n "b": 2}', {"a": 1, "b": 2}),  # the comma is there, escape noise around it
        ('{"a": [1, 2,], "b": 2}', {"a": [1, 2], "b": 2}),  # a trailing comma loses nothing
    ],
)
def test_separators_that_are_there_still_repair(text: str, expected: dict) -> None:
    assert repaired([text], None) == expected


# -- 3. a number that stops after `.`, `e` or `-` ----------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        '{"a":1."b":1.5}',
        '{"a": 1., "b": 2}',
        '{"a": 1e, "b": 2}',
        '{"a": 2E+, "b": 2}',
        '{"a": -, "b": 2}',
        '{"a": [1., 2]}',
    ],
)
def test_a_number_with_its_digits_lost_fails_the_call(text: str) -> None:
    reason, kind = failed([text], None)
    assert kind == MISSING_FRAGMENT
    assert "number" in reason


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1.5e3, "b": 2,}', {"a": 1500.0, "b": 2}),
        ('{"a": -0.25, "b": [1,],}', {"a": -0.25, "b": [1]}),
    ],
)
def test_whole_numbers_next_to_another_defect_still_repair(text: str, expected: dict) -> None:
    assert repaired([text], None) == expected


# -- 4. missing closers at the end -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "name", "finish"),
    [
        ('{"path": "a.txt"', "read", None),  # `offset` and `limit` could have followed
        ('{"path": "a.txt", "offset": 1', "read", None),  # a number at the end may be cut
        ('{"path": "a", "content": "x"', "write", "length"),
        ('{"path": "a", "recursive": true, "globs": ["x"', "list", None),  # a nested container open
        ('{"path": "a", "recursive": true, "globs": [["x"]', "list", None),
        ('{"a": "x"', None, None),  # no schema: nothing says the object was complete
        ('{"a": "x"', "bare", None),  # a schema that declares no properties
        ('{"a": {"b": [1, {"c": "d"}', None, None),
        ('{"a": true', None, None),
    ],
)
def test_missing_closers_that_may_hide_more_arguments_are_a_cut(
    text: str, name: str | None, finish: str | None
) -> None:
    reason, kind = failed([text], name, finish)
    assert reason == CUT
    assert kind == MISSING_LAST_CHUNK


@pytest.mark.parametrize(
    ("text", "name", "expected"),
    [
        ('{"path": "a", "content": "x"', "write", {"path": "a", "content": "x"}),
        ('{"path": "a", "globs": ["x"], "recursive": true', "list", {"path": "a", "globs": ["x"], "recursive": True}),
        (
            '{"path": "a", "recursive": false, "globs": ["x", "y"]',
            "list",
            {"path": "a", "recursive": False, "globs": ["x", "y"]},
        ),
        ('{"command": "ls -la"\n', "shell", {"command": "ls -la"}),
    ],
)
def test_only_the_top_level_brace_missing_after_every_declared_argument_repairs(
    text: str, name: str, expected: dict
) -> None:
    result = repair_arguments([text], name, TOOLS)
    assert result.fatal is None, result.fatal
    assert json.loads(result.text) == expected
    assert MISSING_LAST_CHUNK in result.kinds


# -- 5. a duplicated call keeps the path evidence ----------------------------------------------------
WIN_PATH = r"C:\temp\new\reports"
WIN_ARGS = '{"path":"C:\\temp\\new\\reports","content":"x"}'  # single backslashes, as the model wrote them


@pytest.mark.parametrize(
    "frags",
    [
        ['{"path":"C:\\temp\\n', 'ew\\reports","content":"x"}', WIN_ARGS],  # resent at the finish
        [WIN_ARGS + WIN_ARGS],  # two concatenated objects
        ['{"path":"C:\\temp', '{"path":"C:\\temp', '\\new\\reports","content":"x"}'],  # a fragment sent twice
        ['{"path":"C:\\temp\\new\\reports",', '"content":"x"}', '"content":"x"}'],
    ],
)
def test_a_duplicated_windows_path_keeps_its_backslashes(frags: list[str]) -> None:
    result = repair_arguments(frags, "write", TOOLS)
    assert result.fatal is None, result.fatal
    assert json.loads(result.text) == {"path": WIN_PATH, "content": "x"}
    assert DUPLICATED in result.kinds


@pytest.mark.parametrize(
    "frags",
    [
        ['{"path":"a.txt","content":"line\\n', 'two\\tend"}', '{"path":"a.txt","content":"line\\ntwo\\tend"}'],
        ['{"path":"a.txt","content":"line\\ntwo\\tend"}{"path":"a.txt","content":"line\\ntwo\\tend"}'],
        ['{"path":"a.txt",', '"content":"line\\ntwo\\tend"}', '"content":"line\\ntwo\\tend"}'],
    ],
)
def test_a_duplicated_call_keeps_its_real_escapes(frags: list[str]) -> None:
    result = repair_arguments(frags, "write", TOOLS)
    assert result.fatal is None, result.fatal
    assert json.loads(result.text) == {"path": "a.txt", "content": "line\ntwo\tend"}
    assert DUPLICATED in result.kinds


# -- found by the defect generator after the rules above: a literal or a key with a piece lost ----------
@pytest.mark.parametrize(
    "text",
    [
        '{"items": ["a", "b",rue]}',  # `t` of `true` dropped
        '{"items":ue]}',  # `["a", tr` dropped
        '{"a": fse, "b": 1}',
        '{"pattern": "x", "case_insensitivlse, "max_results": 1}',  # `e": fa` dropped inside a key
    ],
)
def test_a_literal_or_key_with_a_piece_lost_fails_the_call(text: str) -> None:
    _, kind = failed([text], None)
    assert kind == MISSING_FRAGMENT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{a: yes please}", {"a": "yes please"}),  # bare keys, bare values: a writer who quotes nothing
        ('{"a": True, "b": None,}', {"a": True, "b": None}),
    ],
)
def test_bare_words_and_python_literals_still_repair(text: str, expected: dict) -> None:
    assert repaired([text], None) == expected


# -- found by bench/repair_rates.py at 10^5 examples (the last `wrong` calls) --------------------------------
# Each text is what a dropped fragment leaves; no reading may turn it into a call.
DROPS = [
    (['{"', 'path":".","recursive":t', "ull", "}"], "list"),  # `rue` dropped: `tull` is no string
    (['{"path": ".", "recursive": tr', "1}"], "list"),  # `ue, "limit": ` dropped
    (['{"items":true', "]}"], "list"),  # a `[` dropped: the `]` has no opener
    (['{"items": [{', ', "st', 'atus": "x"}]}'], "list"),  # a member dropped between `{` and `,`
    (['{"path": "a", "offset":', "0000}"], "read"),  # digits dropped: `120000` → `0000`
    (['{"path": "a", "offset": .5}'], "read"),  # `0` dropped
    (['{"tasks":', '此调优", "prio', 'rity": "medium"}'], None),  # a string's opening quote dropped
    (['{"a": yes please}'], "shell"),  # quoted keys, a bare value: its quotes were lost
]


@pytest.mark.parametrize(("frags", "name"), DROPS)
def test_what_a_dropped_fragment_leaves_is_never_a_call(frags: list[str], name: str | None) -> None:
    result = repair_arguments(frags, name, TOOLS if name else NO_TOOLS)
    assert result.fatal is not None, result.text


@pytest.mark.parametrize(
    ("frags", "expected"),
    [
        (['{"command": "ls"}{"command": "ls"}{"command": "ls"}'], {"command": "ls"}),  # three copies
        (['{"command":\\t"ls"}{"command":\\t"ls"}', '{"command":\\t"ls"}'], {"command": "ls"}),
    ],
)
def test_what_no_drop_can_leave_still_repairs(frags: list[str], expected: dict) -> None:
    result = repair_arguments(frags, "shell", TOOLS)
    assert result.fatal is None, result.fatal
    assert json.loads(result.text) == expected
