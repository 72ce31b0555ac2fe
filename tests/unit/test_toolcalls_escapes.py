"""Escapes read on evidence: path-shaped tokens keep their backslashes, code keeps its newlines, and a
string whose two readings both fit is never guessed. Plus fragments sent twice in a row (MTP)."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tapfix.proxy.toolcalls import ChatToolCallRepair
from tapfix.proxy.toolcalls.arguments import repair_arguments
from tapfix.proxy.toolcalls.defects import AMBIGUOUS_ESCAPE, DUPLICATED, INVALID_JSON, MISSING_FRAGMENT
from tapfix.proxy.toolcalls.escapes import path_like_key
from tapfix.proxy.toolcalls.schema import ToolSchemas

from tests.support.builders import chat_chunk, random_splits, sse, tool, tool_call_chunk
from tests.support.depth import examples
from tests.support.stage_io import client_view, run_stage

SHELL = tool("shell", {"command": {"type": "string"}}, ["command"])
WRITE = tool("write", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"])
OPEN = tool("open", {"target": {"type": "string", "description": "Path of the file to open"}}, ["target"])
SEARCH = tool("search", {"query": {"type": "string", "pattern": "^[^\\x00-\\x1f]*$"}}, ["query"])
TOOLS = ToolSchemas([SHELL, WRITE, OPEN, SEARCH])
NO_TOOLS = ToolSchemas(None)


def repaired(text: str | list[str], name: str | None = None, schemas: ToolSchemas = TOOLS) -> dict:
    result = repair_arguments([text] if isinstance(text, str) else text, name, schemas)
    assert result.fatal is None, result.fatal
    return json.loads(result.text)


# -- path-shaped tokens ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "name", "expected"),
    [
        # valid JSON, but `\t` `\n` `\r` `\b` `\f` would be control characters inside a Windows path
        (r'{"path": "C:\temp\new\reports", "content": "x"}', "write", {"path": r"C:\temp\new\reports", "content": "x"}),
        (r'{"command": "C:\bin\app.exe --help"}', "shell", {"command": r"C:\bin\app.exe --help"}),
        (r'{"command": "cd D:\repo\feature && make"}', "shell", {"command": r"cd D:\repo\feature && make"}),
        (r'{"command": "type \\fs01\new\tmp.txt"}', "shell", {"command": r"type \\fs01\new\tmp.txt"}),
        # not valid JSON (`\s`, `\D`): the whole token is literal, the valid-looking pairs too
        (r'{"command": "dir \\server\share\new"}', "shell", {"command": r"dir \\server\share\new"}),
        (r'{"command": "copy C:\Data\new\x.txt E:\backup"}', "shell", {"command": r"copy C:\Data\new\x.txt E:\backup"}),
        (r'{"command": "run \"C:\tools\run.bat\" now"}', "shell", {"command": r'run "C:\tools\run.bat" now'}),
        # broken JSON (a trailing comma, a lost brace) and the property is a path: plain names are a path too
        (r'{"path": "src\new\table.py", "content": "x",}', "write", {"path": r"src\new\table.py", "content": "x"}),
        (r'{"target": "docs\readme.md"', "open", {"target": r"docs\readme.md"}),
        # strong evidence inside the token (`\d`): literal, in any property
        (r'{"command": "ls src\data\new"}', "shell", {"command": r"ls src\data\new"}),
    ],
)
def test_path_shaped_tokens_keep_their_backslashes(text: str, name: str, expected: dict) -> None:
    result = repair_arguments([text], name, TOOLS)
    assert result.fatal is None
    assert json.loads(result.text) == expected
    assert result.kinds[0] == INVALID_JSON


def test_the_change_says_which_token_was_read_literally() -> None:
    result = repair_arguments([r'{"path": "C:\temp\new", "content": "x"}'], "write", TOOLS)
    assert any("path-shaped token read with literal backslashes" in f and r"C:\temp\new" in f for f in result.fixes)


def test_code_keeps_its_newlines_and_gets_its_regex_backslash() -> None:
    text = r'{"command": "import re\nx = re.match(r' + "'" + r"\d+" + "'" + r', s)\nprint(x)"}'
    value = repaired(text, "shell")["command"]
    assert value.count("\n") == 2 and r"\d+" in value


@pytest.mark.parametrize(
    "value",
    [
        {"path": "C:\\temp\\new", "content": "x"},
        {"path": "a.txt", "content": "Path: C:\\temp\nnext line\tend"},
        {"path": "\\\\fs01\\share\\new", "content": "line1\nline2\n"},
        {"path": "a", "content": "print('a\\nb')\n"},
    ],
)
def test_well_escaped_arguments_are_untouched(value: dict) -> None:
    text = json.dumps(value)
    result = repair_arguments([text], "write", TOOLS)
    assert result.text == text and not result.changed


@pytest.mark.parametrize(
    ("text", "name"),
    [
        (r'{"command": "printf a\nb\nc"}', "shell"),
        (r'{"path": "a\nb", "content": "x"}', "write"),  # valid JSON: a newline, even in a path
        (r'{"command": "\\section\n"}', "shell"),  # LaTeX and a newline, not \\section\n
    ],
)
def test_valid_json_is_trusted_for_plain_names(text: str, name: str) -> None:
    result = repair_arguments([text], name, TOOLS)
    assert result.text == text and not result.changed


# -- both readings fit: the schema decides, or the call fails -----------------------------------------
def test_two_fitting_readings_fail_the_call() -> None:
    # `\D` shows the writer left backslashes unescaped; `src\new\table` may be a path or two lines
    result = repair_arguments([r'{"command": "cp src\new\table D:\Data"}'], "shell", TOOLS)
    assert result.fatal is not None and "ambiguous" in result.fatal
    assert result.kinds[0] == AMBIGUOUS_ESCAPE


def test_the_schema_picks_the_only_fitting_reading() -> None:
    value = repaired(r'{"query": "src\new\table D:\Data"}', "search")
    assert value == {"query": r"src\new\table D:\Data"}


def test_one_separator_in_broken_json_keeps_the_json_reading() -> None:
    assert repaired(r'{"command": "echo a\nb \d"}', "shell") == {"command": "echo a\nb \\d"}


# -- outside strings ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r'{\n  "a": 1,\n  "b": [1,\t2]\n}', {"a": 1, "b": [1, 2]}),
        (r'\n{"a": "x"}\n', {"a": "x"}),
        (r'{"a": "x"\r\n}', {"a": "x"}),
    ],
)
def test_escaped_whitespace_between_tokens_is_dropped(text: str, expected: dict) -> None:
    result = repair_arguments([text], None, NO_TOOLS)
    assert result.fatal is None and json.loads(result.text) == expected
    assert "escaped whitespace between tokens dropped" in result.fixes


def test_raw_control_characters_are_escaped() -> None:
    assert repaired('{"a": "x\ty\nz"}', None, NO_TOOLS) == {"a": "x\ty\nz"}


# -- unescaped quotes --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"cmd": "echo "hi" now"}', {"cmd": 'echo "hi" now'}),
        ('{"q": "he said "hi" twice, then left", "r": 1}', {"q": 'he said "hi" twice, then left', "r": 1}),
    ],
)
def test_unescaped_quotes_with_an_unambiguous_end(text: str, expected: dict) -> None:
    assert repaired(text, None, NO_TOOLS) == expected


@pytest.mark.parametrize(
    "text",
    [
        '{"path": "/tmp/fo, "mode": "w"}',
        '{"a": "x, "b": 1, "c": "y"}',
        '{"pattern": "src/apph": "src/app.py"}',  # a key's closing quote inside the value
        '{"pattern": "x", "pd", "options": {"c": 0}}',  # a key running into the next member
        '{"items": ["a",}',  # the rest of the array and its `]` were lost
        '{"q": "he said "hi", then left"}',  # also `"hi", "x": "then left"` with `"x": "` lost
        '{"q": "a "b"", "r": 2}',  # a quote right after a quote: `, "x": ` may be lost between them
    ],
)
def test_a_quote_repair_never_swallows_the_next_member(text: str) -> None:
    result = repair_arguments([text], None, NO_TOOLS)
    assert result.fatal is not None
    assert result.kinds[0] == MISSING_FRAGMENT


# -- fragments sent twice in a row -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("frags", "expected"),
    [
        (['{"path": "a.t', 'xt", ', 'xt", ', '"content": "hi"}'], {"path": "a.txt", "content": "hi"}),
        (['{"command"', ': "ls', " -la", " -la", '"}'], None),  # valid as sent: never touched
        (['{"command": ', '"', '"', 'ls"}'], {"command": "ls"}),
        (['{"command": "ls"', "}", "}"], {"command": "ls"}),
        (['{"path": "a"', ", ", ", ", '"content": "b"}'], {"path": "a", "content": "b"}),
        (['{"command": "l', 's"}', 's"}', '{"command": "l', 's"}', 's"}'], {"command": "ls"}),  # and sent twice
    ],
)
def test_a_fragment_sent_twice_in_a_row(frags: list[str], expected: dict | None) -> None:
    result = repair_arguments(frags, "shell" if "command" in frags[0] else "write", TOOLS)
    assert result.fatal is None
    if expected is None:
        assert result.text == "".join(frags) and not result.changed
    else:
        assert json.loads(result.text) == expected
        assert DUPLICATED in result.kinds


# -- properties --------------------------------------------------------------------------------------
NAME_CHARS = "abcdefghijklmnoprstvwxyzABCDEFGHIJKLMNOPRSTVWXYZ0123456789_.-"
names = st.text(NAME_CHARS, min_size=1, max_size=8).filter(lambda s: not re.match(r"u[0-9a-fA-F]{4}", s))
# A first folder that is one escape letter (`C:\f\f`) has code's shape too (`if x:\n\t\treturn`):
# where both readings parse, json's stands (test_code_with_a_colon_before_its_escapes_is_no_drive_path).
first_names = names.filter(lambda s: s not in ("b", "f", "n", "r", "t"))
prefixes = st.sampled_from(["C:\\", "d:\\", "\\\\fs01\\", "\\\\host-2.lan\\"])


def corrupt(value: dict) -> str:
    """What a writer that forgot to double backslashes sends: dumped JSON with every `\\\\` un-doubled."""
    return json.dumps(value).replace("\\\\", "\\")


@settings(deadline=None, max_examples=examples(150))
@given(
    prefixes,
    st.tuples(first_names, st.lists(names, max_size=4)).map(lambda t: [t[0], *t[1]]),
    st.sampled_from(["path", "command"]),
)
def test_windows_paths_survive_unescaped_backslashes(prefix: str, parts: list[str], key: str) -> None:
    # `\\\\name\\x` alone may be an escaped `\\name` and a control character (LaTeX's `\\section\\n`)
    assume(not prefix.startswith("\\\\") or len(parts) >= 2)
    assume(prefix.startswith("\\\\") or len(parts) > 1 or len(parts[0]) > 1)  # `if x:\n` is code
    path = prefix + "\\".join(parts)
    value = {"path": path, "content": "x"} if key == "path" else {"command": "dir " + path + " /s"}
    result = repair_arguments([corrupt(value)], "write" if key == "path" else "shell", TOOLS)
    assert result.fatal is None
    assert json.loads(result.text) == value


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(deadline=None, max_examples=examples(200))
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=4), st.booleans())
def test_valid_json_without_backslash_evidence_is_untouched(value: dict, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    # evidence would be: a backslash in a value, a drive letter before a control character, a path key
    assume("<|" not in text)  # Gemma delimiters are stripped from any value (another rule)
    assume("\\\\" not in text and not re.search(r"[A-Za-z]:\\[bfnrt]", text))
    assume(not any(path_like_key(k) for k in re.findall(r'"([^"\\]*)":', text)))
    result = repair_arguments([text], None, NO_TOOLS)
    assert result.text == text and not result.changed


# -- through the streaming stage ---------------------------------------------------------------------
def test_a_streamed_windows_path_reaches_the_client_literally() -> None:
    stream = [
        chat_chunk({"role": "assistant", "content": ""}),
        tool_call_chunk(0, "call_1", "write", ""),
        tool_call_chunk(0, arguments='{"path": "C:\\temp'),
        tool_call_chunk(0, arguments='\\new\\reports", "content": "done"}'),
        chat_chunk(finish_reason="tool_calls"),
    ]
    stage = ChatToolCallRepair([WRITE], capture_id="cap")
    out = run_stage(stage, random_splits(sse(stream), random.Random(3)))
    calls = client_view(out).calls
    assert len(calls) == 1
    assert json.loads(calls[0]["arguments"]) == {"path": r"C:\temp\new\reports", "content": "done"}
    assert any(c.kind == INVALID_JSON and "literal backslashes" in c.reason for c in stage.changes)


def test_code_with_a_colon_before_its_escapes_is_no_drive_path() -> None:
    """`if x:` then `\\n\\t\\t`: a one-letter word and a colon before escapes is code, not `X:\\…`
    (found by the Responses leak work: valid JSON code came out with literal backslashes)."""
    text = json.dumps({"content": "def f(x):\n\tif x:\n\t\treturn 1\n"})
    result = repair_arguments([text], None, ToolSchemas(None))
    assert result.fatal is None and not result.changed and result.text == text


_PIECES = st.sampled_from(["C:", "\\", "\\\\", "n", "t", "b", "a", "dir", ".", "-", " ", '"', '\\"', ":", "(", "x1"])


@given(st.lists(st.lists(_PIECES, max_size=12).map("".join), max_size=4), st.booleans())
@settings(max_examples=examples(500), deadline=None)
def test_only_tokens_the_gate_sees_are_examined(values: list[str], path: bool) -> None:
    """`path_tokens` examines only the tokens where `GATE` matches: every token it would keep matches there
    (a control escape after a path character, or a UNC prefix), so skipping the others changes nothing."""
    from tapfix.proxy.toolcalls import escapes

    text = "{" + ", ".join(f'"{"path" if path else "k"}{n}": "{v}"' for n, v in enumerate(values)) + "}"
    every = []
    if escapes.GATE.search(text) is not None:
        for start, end, key in escapes._values(text):
            body = text[start:end]
            prop = escapes.path_like_property(key, None)
            found = (escapes._examine(t.group(), start + t.start(), key, prop) for t in escapes._TOKEN.finditer(body))
            every += [token for token in found if token is not None and "\\" in body]
    assert escapes.path_tokens(text, None) == every
