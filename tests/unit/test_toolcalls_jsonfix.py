"""Tables of one-line repairs: what the argument repair makes of a received string."""

from __future__ import annotations

import json

import pytest
from tapfix.proxy.toolcalls.arguments import CUT, repair_arguments
from tapfix.proxy.toolcalls.jsonfix import LOST_COMMA, LOST_DIGITS, LOST_STRING_END, MISSING, is_debris, loads_tolerant
from tapfix.proxy.toolcalls.schema import ToolSchemas

from tests.support.builders import tool

NO_TOOLS = ToolSchemas(None)

WRITE = ToolSchemas([tool("write", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"])])
TYPED = ToolSchemas(
    [
        tool(
            "t",
            {
                "flag": {"type": "boolean"},
                "n": {"type": "integer"},
                "x": {"type": "number"},
                "items": {"type": "array"},
                "opts": {"type": "object"},
                "maybe": {"type": ["integer", "null"]},
                "nested": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"on": {"type": "boolean"}}},
                },
            },
            [],
        )
    ]
)

# (received text, arguments the client gets)
REPAIRS = [
    ('{"a": 1}', {"a": 1}),
    ('{"a": True, "b": False, "c": None}', {"a": True, "b": False, "c": None}),
    ('{"s": "True and None stay text"}', {"s": "True and None stay text"}),
    ("{'a': 'b'}", {"a": "b"}),
    ("{'say': 'it\\'s \"quoted\"'}", {"say": 'it\'s "quoted"'}),
    ('{"a": 1,}', {"a": 1}),
    ('{"a": [1, 2,],}', {"a": [1, 2]}),
    ('{"a": "line\nbreak"}', {"a": "line\nbreak"}),
    ('{"a": "tab\there"}', {"a": "tab\there"}),
    ('{"p": "C:\\Data"}', {"p": "C:\\Data"}),
    ('{"q": "he said "hi" twice"}', {"q": 'he said "hi" twice'}),
    ('{"q": "名字叫"3.14根毛"的", "r": 1}', {"q": '名字叫"3.14根毛"的', "r": 1}),
    ('{}""', {}),
    ('{"a": 1}  ""', {"a": 1}),
    ('{"a": 1}}', {"a": 1}),
    ('{"a": 1}\n</tool_call>', {"a": 1}),
    ('{"a": 1}{"a": 1}', {"a": 1}),
    ('{a: 1, b: "x"}', {"a": 1, "b": "x"}),
    ('code": "uptime"}', {"code": "uptime"}),
    ('"code": "uptime"}', {"code": "uptime"}),
    ('{"c": "<|\\begin<|\\"|", "d": "<|\\"end<|\\"}', {"c": "begin", "d": "end"}),
    ('{"c": "<|"|>x<|"|>"}', {"c": "x"}),
    ('{"c": <|"|>bare<|"|>}', {"c": "bare"}),
    ('"{\\"a\\": 1}"', {"a": 1}),
    ('{"e": "\\ud83d\\ude00"}', {"e": "\U0001f600"}),
    ("", {}),
    ("   ", {}),
]


@pytest.mark.parametrize(("text", "expected"), REPAIRS)
def test_repair(text: str, expected: dict) -> None:
    result = repair_arguments([text] if text else [], None, NO_TOOLS)
    assert result.fatal is None
    assert json.loads(result.text) == expected


# (received text, why it cannot be sent)
UNRECOVERABLE = [
    ('{"a": "x', CUT, "length"),
    ('{"a": "x"', CUT, "length"),
    ('{"a": 12', CUT, "length"),
    ('{"a": 12', CUT, None),  # a number with its closers missing may be trimmed (`1.` of `1.5` in the corpus)
    ('{"a": {"b": [1, 2', CUT, None),
    ('{"path": set": 1, "limit": 2}', "a string runs into the next member: its end was lost", None),
    ('{"a": 1.', CUT, None),
    ('{"a": -', CUT, None),
    ('{"a": 1e', CUT, None),
    ('{"a": tru', CUT, None),
    ('{"a": "unterminated', CUT, None),
    ('{"a": "x\\', CUT, None),
    ('{"a": "\\u00', CUT, None),
    ('{"a":', CUT, None),
    ('{"a": 1, ', CUT, None),
    ('{"a": 1, "b', CUT, None),
    ('{"a": 1}{"b": 2}', "two argument objects in one call", None),
    ("[1, 2]", "arguments are not a JSON object", None),
    ("just words", "arguments are not a JSON object", None),
    ('{"a": 1, "b": 2, "a": 3', "a key repeats: fragments were spliced", None),
    ('{"a" 1}', LOST_STRING_END, None),  # the `:` was lost: a key never holds a quote
    # a fragment drop would leave the same text (tests/unit/test_toolcalls_no_guess.py has each rule both ways)
    ('{"a": 1 "b": 2}', LOST_COMMA, None),  # `5,` of `{"a": 15, "b": 2}`
    ('{"a": 1."b": 1.5}', LOST_DIGITS, None),
    ('{"a": "x"', CUT, None),  # no schema says nothing more could have followed
    ('{"a": {"b": [1, {"c": "d"}', CUT, None),  # more than the top-level `}` missing
    ('{"a": true', CUT, None),
]


@pytest.mark.parametrize(("text", "reason", "finish"), UNRECOVERABLE)
def test_unrecoverable(text: str, reason: str, finish: str | None) -> None:
    assert repair_arguments([text], None, NO_TOOLS, finish).fatal == reason


# (fragments as they arrived, arguments the client gets): rules over the fragment sequence
FRAGMENTS = [
    (['{"a": 1', ', "b": "x"}', '{"a": 1, "b": "x"}'], {"a": 1, "b": "x"}),
    (['{"a": ""x', '", "b": "y{"a": "x", "b": "y"}'], None),
    (['{"a": 1; "b": 2}'], {"a": 1, "b": 2}),
    (['{"wd": 2', "3", ', "i": ""Z', '{"wd": 23, "i": "Z"}'], {"wd": 23, "i": "Z"}),
    ([{"a": 1}], {"a": 1}),
    (["", {"a": 1}], {"a": 1}),
    (['{"a": ', {"a": 1}], {"a": 1}),
    ([{"a": [1]}, {"a": [1]}], {"a": [1]}),
]


@pytest.mark.parametrize(("frags", "expected"), FRAGMENTS)
def test_fragments(frags: list, expected: dict | None) -> None:
    result = repair_arguments(frags, None, NO_TOOLS)
    if expected is None:
        assert result.fatal is not None
    else:
        assert json.loads(result.text) == expected


# (received, arguments after fitting to TYPED's schema)
SCHEMA = [
    ('{"flag": "True"}', {"flag": True}),
    ('{"flag": "false"}', {"flag": False}),
    ('{"flag": "maybe"}', {"flag": "maybe"}),
    ('{"n": "42"}', {"n": 42}),
    ('{"n": "4.5"}', {"n": "4.5"}),
    ('{"x": "4.5"}', {"x": 4.5}),
    ('{"x": "nan"}', {"x": "nan"}),
    ('{"items": "[\\"a\\", 1, true]"}', {"items": ["a", 1, True]}),
    ('{"items": "not a list"}', {"items": "not a list"}),
    ('{"opts": "{\\"k\\": 1}"}', {"opts": {"k": 1}}),
    ('{"maybe": "None"}', {"maybe": None}),
    ('{"maybe": "7"}', {"maybe": 7}),
    ('{"nested": [{"on": "TRUE"}, {"on": false}]}', {"nested": [{"on": True}, {"on": False}]}),
    ('{"other": "True"}', {"other": "True"}),
]


@pytest.mark.parametrize(("text", "expected"), SCHEMA)
def test_schema_fit(text: str, expected: dict) -> None:
    assert json.loads(repair_arguments([text], "t", TYPED).text) == expected


def test_valid_arguments_keep_their_exact_text() -> None:
    text = '{ "path":"a.txt" ,"content" : "\\u00e9"}'
    result = repair_arguments([text], "write", WRITE)
    assert result.text == text and not result.changed


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("{}", "'path', 'content'"),
        ('{"path": "a"}', "'content'"),
        ("", "'path', 'content'"),
    ],
)
def test_required_never_invented(text: str, missing: str) -> None:
    assert repair_arguments([text], "write", WRITE).fatal == f"required argument {missing} never sent"


def test_missing_prefix_needs_a_declared_name() -> None:
    assert json.loads(repair_arguments(['path": "a", "content": "b"}'], "write", WRITE).text) == {
        "path": "a",
        "content": "b",
    }
    assert repair_arguments(['colour": "red"}'], "write", WRITE).fatal is not None


@pytest.mark.parametrize(
    ("rest", "debris"),
    [
        ('""', True),
        ("}", True),
        ("\n</tool_call>", True),
        ("  ]}", True),
        (' {"a": 1}', False),
        ("text", False),
    ],
)
def test_is_debris(rest: str, debris: bool) -> None:
    assert is_debris(rest) is debris


def test_tolerant_reader_never_raises_on_odd_input() -> None:
    for text in ["{" * 500, "[" * 300 + "]", "\\", '"\\u', "<|", '{"a": <|"|>', "-", "{:}", "{,}", "\x00"]:
        assert loads_tolerant(text).value is not None or True
    assert loads_tolerant("").value is MISSING
