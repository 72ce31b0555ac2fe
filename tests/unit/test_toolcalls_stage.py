"""Unseen variants of each defect class (not from the corpus), policies, holding and keep-alive."""

from __future__ import annotations

import json
import random
from functools import partial

import pytest
from tapfix.proxy.sse import SSESplitter
from tapfix.proxy.toolcalls import ChatToolCallRepair

from tests.support.builders import chat_chunk, random_splits, sse, tool, tool_call_chunk
from tests.support.stage_io import client_view, run_stage

READ = tool("read", {"path": {"type": "string"}, "limit": {"type": "integer"}}, ["path"])
WRITE = tool("write", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"])
GREP = tool(
    "grep",
    {
        "pattern": {"type": "string"},
        "ignore_case": {"type": "boolean"},
        "globs": {"type": "array", "items": {"type": "string"}},
    },
    ["pattern"],
)
TOOLS = [READ, WRITE, GREP]

# This module's upstream: chunk id chatcmpl-u1 (one test checks the stage keeps it).
chunk = partial(chat_chunk, id="chatcmpl-u1")
call = partial(tool_call_chunk, chunk_id="chatcmpl-u1")


def content(text: str) -> dict:
    return chunk({"content": text})


ROLE = chunk({"role": "assistant", "content": ""})
STOP = chunk(finish_reason="stop")
TOOL_FINISH = chunk(finish_reason="tool_calls")


def run(stream: list, tools=TOOLS, seed: int = 0, **kw) -> tuple[bytes, bytes, ChatToolCallRepair]:
    data = sse(stream)
    stage = ChatToolCallRepair(tools, capture_id="cap", **kw)
    return data, run_stage(stage, random_splits(data, random.Random(seed))), stage


def calls_of(out: bytes) -> list[tuple[str, dict]]:
    return [(c["name"], json.loads(c["arguments"])) for c in client_view(out).calls]


def assert_unrecoverable(out: bytes, stage: ChatToolCallRepair) -> None:
    view = client_view(out)
    assert stage.outcome == "unrecoverable"
    assert len(view.errors) == 1 and view.errors[0]["code"] == 502 and view.done == 1 and view.after_done == 0
    assert not view.calls


# -- valid streams stay byte-identical -------------------------------------------------------------
VALID = [
    [
        ROLE,
        content("Let me look."),
        call(0, "c1", "read", ""),
        call(0, arguments='{"path": '),
        call(0, arguments='"a.py"}'),
        TOOL_FINISH,
        chunk(usage={"prompt_tokens": 1}) | {"choices": []},
    ],
    [
        chunk({"reasoning_content": "think <tool_call> maybe"}),
        call(0, "c1", "grep", '{"pattern": "x"}'),
        call(1, "c2", "read", '{"path": "b"}'),
        TOOL_FINISH,
    ],
    [ROLE, content("<b>bold</b> and [links](x) {json: 1} `code`"), STOP],
    [ROLE, content('{"name": "Bob", "age": 3}'), STOP],
    [ROLE, content("<tool"), content("s are fun>"), STOP],
    [ROLE, content("Use <tool_call> tags"), content(" like this."), STOP],
    [ROLE, content("[TOOL"), content("BOX]"), STOP],
]


@pytest.mark.parametrize("stream", VALID)
@pytest.mark.parametrize("seed", [0, 1])
def test_valid_stream_is_byte_identical(stream: list, seed: int) -> None:
    data, out, stage = run(stream, seed=seed)
    assert out == data and stage.outcome == "untouched" and not stage.changes


def test_comments_crlf_and_odd_spacing_pass() -> None:
    data = (
        b': ping\r\n\r\ndata:{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a",'
        b'"function":{"name":"read","arguments":"{\\"path\\":\\"\\u00e9\\"}"}}]}}]}\r\n\r\n'
        b': ping\r\n\r\ndata: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    for seed in range(5):
        assert run_stage(ChatToolCallRepair(TOOLS), random_splits(data, random.Random(seed), 7)) == data


def test_content_goes_out_at_once_and_calls_are_held() -> None:
    stage = ChatToolCallRepair(TOOLS)
    events = SSESplitter().feed(sse([ROLE, content("Hi"), call(0, "c1", "read", '{"path": "a"}'), TOOL_FINISH]))
    assert stage.feed(events[0]) == [events[0]]
    assert stage.feed(events[1]) == [events[1]]
    assert stage.feed(events[2]) == []
    assert stage.feed(events[3]) == events[2:4]
    assert stage.feed(events[4]) == [events[4]]


def test_no_tools_fast_path_returns_the_event() -> None:
    stage = ChatToolCallRepair(None)
    event = sse([content("<tool_call>{}")], done=False)
    assert stage.feed(event) == [event]


# -- one rule per defect class, on cases of our own ------------------------------------------------
REPAIRED = [
    (
        "duplicated: final chunk resends",
        [
            call(0, "c1", "read", ""),
            call(0, arguments='{"path": "a'),
            call(0, arguments='bc"}'),
            call(0, arguments='{"path": "abc"}'),
            TOOL_FINISH,
        ],
        [("read", {"path": "abc"})],
    ),
    (
        "duplicated: id/type/name repeated mid-call",
        [call(0, "c1", "read", '{"path": '), call(0, "c1", "read", '"x"'), call(0, arguments="}"), TOOL_FINISH],
        [("read", {"path": "x"})],
    ),
    (
        "duplicated: whole arguments twice",
        [call(0, "c1", "read", '{"path": "x"}'), call(0, arguments='{"path": "x"}'), TOOL_FINISH],
        [("read", {"path": "x"})],
    ),
    (
        "missing first chunk",
        [
            call(0, "c1", "write", ""),
            call(0, arguments='path": "a", '),
            call(0, arguments='"content": "b"}'),
            TOOL_FINISH,
        ],
        [("write", {"path": "a", "content": "b"})],
    ),
    (
        "missing last chunk after a closed string, every declared property sent",
        [call(0, "c1", "write", '{"path": "a.py", "content": "x"'), TOOL_FINISH],
        [("write", {"path": "a.py", "content": "x"})],
    ),
    (
        "args as object in the opener",
        [call(0, "c1", "read", {"path": "o"}), TOOL_FINISH],
        [("read", {"path": "o"})],
    ),
    (
        "args as object after a prefix of it",
        [call(0, "c1", "read", '{"path"'), call(0, arguments={"path": "o"}), TOOL_FINISH],
        [("read", {"path": "o"})],
    ),
    (
        "python dict repr",
        [call(0, "c1", "grep", "{'pattern': 'it\\'s', 'ignore_case': True, 'globs': ['a',]}"), TOOL_FINISH],
        [("grep", {"pattern": "it's", "ignore_case": True, "globs": ["a"]})],
    ),
    (
        "unescaped quotes and newline",
        [call(0, "c1", "write", '{"path": "q.md", "content": "say "hi"\nbye"}'), TOOL_FINISH],
        [("write", {"path": "q.md", "content": 'say "hi"\nbye'})],
    ),
    (
        "stray quotes after the object",
        [call(0, "c1", "read", '{"path": "a"}'), call(0, arguments='""'), TOOL_FINISH],
        [("read", {"path": "a"})],
    ),
    (
        "schema: strings for bool, int and array",
        [
            call(0, "c1", "grep", '{"pattern": "x", "ignore_case": "FALSE", "globs": "[\\"*.md\\"]"}'),
            TOOL_FINISH,
        ],
        [("grep", {"pattern": "x", "ignore_case": False, "globs": ["*.md"]})],
    ),
    (
        "schema: integer sent as string",
        [call(0, "c1", "read", '{"path": "a", "limit": "20"}'), TOOL_FINISH],
        [("read", {"path": "a", "limit": 20})],
    ),
    (
        "two calls on one index, different names, no ids",
        [call(0, None, "read", '{"path": "a"}'), call(0, None, "grep", '{"pattern": "b"}'), TOOL_FINISH],
        [("read", {"path": "a"}), ("grep", {"pattern": "b"})],
    ),
    (
        "index missing on every delta",
        [
            call(None, "c1", "read", '{"path": '),
            call(None, arguments='"a"}'),
            call(None, "c2", "read", '{"path": "b"}'),
            TOOL_FINISH,
        ],
        [("read", {"path": "a"}), ("read", {"path": "b"})],
    ),
    ("null arguments, nothing required", [call(0, "c1", "grep", None), TOOL_FINISH], None),
    (
        "stop instead of tool_calls with a repair",
        [call(0, "c1", "read", "{'path': 'a'}"), STOP],
        [("read", {"path": "a"})],
    ),
    (
        "stream ends without finish or [DONE]",
        [call(0, "c1", "read", "{'path': 'a'}")],
        [("read", {"path": "a"})],
    ),
]


@pytest.mark.parametrize(("label", "stream", "expected"), REPAIRED, ids=[r[0] for r in REPAIRED])
@pytest.mark.parametrize("seed", [0, 1])
def test_repaired(label: str, stream: list, expected: list | None, seed: int) -> None:
    tools = [tool("grep", {"pattern": {"type": "string"}})] if expected is None else TOOLS
    done = label != "stream ends without finish or [DONE]"
    data = sse([ROLE] + stream, done=done)
    stage = ChatToolCallRepair(tools)
    out = run_stage(stage, random_splits(data, random.Random(seed)))
    view = client_view(out)
    assert calls_of(out) == (expected or [("grep", {})])
    assert [c["id"] for c in view.calls] and all(view.calls[i]["id"] for i in range(len(view.calls)))
    assert view.finish_reasons == ["tool_calls"] and not view.errors
    assert stage.outcome == "repaired" and stage.changes and stage.defects
    assert all(c.stage == "toolcalls" and c.path.startswith("$.choices[0]") for c in stage.changes)


def test_parallel_calls_keep_stable_indexes_ids_and_envelope() -> None:
    _, out, _ = run([ROLE, call(0, "id-a", "read", {"path": "a"}), call(0, "id-b", "read", {"path": "b"}), STOP])
    view = client_view(out)
    tool_chunks = [c for c in view.chunks if any(ch["delta"].get("tool_calls") for ch in c["choices"])]
    assert [tc["index"] for c in tool_chunks for tc in c["choices"][0]["delta"]["tool_calls"]] == [0, 1]
    assert [c["id"] for c in view.calls] == ["id-a", "id-b"]
    assert {c["id"] for c in tool_chunks} == {"chatcmpl-u1"} and tool_chunks[0]["model"] == "m"


def test_name_is_inferred_only_with_a_single_tool() -> None:
    stream = [ROLE, call(0, "c1", "read", '{"path": "a"}'), call(1, None, None, '{"path": "b"}'), TOOL_FINISH]
    _, out, _ = run(stream, tools=[READ])
    assert calls_of(out) == [("read", {"path": "a"}), ("read", {"path": "b"})]
    _, out, stage = run(stream, tools=TOOLS)
    assert_unrecoverable(out, stage)


UNRECOVERABLE = [
    (
        "cut inside a string by max_tokens",
        [call(0, "c1", "write", '{"path": "a", "content": "hal'), chunk(finish_reason="length")],
    ),
    ("closed value but finish length", [call(0, "c1", "read", '{"path": "a.py"'), chunk(finish_reason="length")]),
    # Closers are put back only when nothing more could have been sent (issue 16: never guess).
    ("missing closer, an optional property unsent", [call(0, "c1", "read", '{"path": "a.py"'), TOOL_FINISH]),
    ("missing closers of a nested value", [call(0, "c1", "grep", '{"pattern": "x", "globs": ["*.py"'), TOOL_FINISH]),
    ("cut number", [call(0, "c1", "read", '{"path": "a", "limit": 1.'), TOOL_FINISH]),
    ("required argument never sent", [call(0, "c1", "write", '{"path": "a"}'), TOOL_FINISH]),
    ("null arguments with required", [call(0, "c1", "read", None), TOOL_FINISH]),
    (
        "bytes dropped mid-key",
        [call(0, "c1", "write", '{"path": "a", "cont'), call(0, arguments='": "b"}'), TOOL_FINISH],
    ),
    (
        "string and object disagree",
        [call(0, "c1", "read", '{"path": "z"'), call(0, arguments={"path": "o"}), TOOL_FINISH],
    ),
    ("upstream cut the stream mid-call", [call(0, "c1", "write", '{"path": "a", "content": "b')]),
    # The server's parser dropped the call (an inline one, say): a tool_calls finish with nothing in it
    # would be a silent empty turn for the agent.
    ("finish tool_calls with no call", [TOOL_FINISH]),
]


@pytest.mark.parametrize(("label", "stream"), UNRECOVERABLE, ids=[u[0] for u in UNRECOVERABLE])
def test_unrecoverable_error_policy(label: str, stream: list) -> None:
    data = sse([ROLE, content("Writing now."), *stream, chunk(usage={"total_tokens": 3}) | {"choices": []}])
    stage = ChatToolCallRepair(TOOLS, capture_id="cap-1")
    out = run_stage(stage, random_splits(data, random.Random(9)))
    assert_unrecoverable(out, stage)
    view = client_view(out)
    assert view.content == "Writing now."
    error = view.errors[0]
    assert error["type"] == "server_error" and "server error" in error["message"]
    assert error["tapfix"] == {
        "reason": "tool_call_unrecoverable",
        "capture_id": "cap-1",
        "defect": stage.defects[-1],
    }
    assert out.endswith(b"data: [DONE]\n\n")


def test_fail_fast_has_no_retry_words_anywhere() -> None:
    stream = [ROLE, call(0, "c1", "write", '{"path": "a", "content": "b'), chunk(finish_reason="length")]
    _, out, stage = run(stream, policy="fail_fast")
    error = client_view(out).errors[0]
    assert error["type"] == "tool_call_unrecoverable" and error["code"] == "tool_call_unrecoverable"
    stage = ChatToolCallRepair(TOOLS, policy="fail_fast", capture_id="c502-timeout")
    out = run_stage(stage, [sse(stream)])
    assert b"502" not in out and b"timeout" not in out


def test_passthrough_policy_keeps_bytes_and_adds_a_comment() -> None:
    stream = [ROLE, call(0, "c1", "write", '{"path": "a", "content": "b'), chunk(finish_reason="length")]
    data, out, stage = run(stream, policy="passthrough")
    assert stage.outcome == "unrecoverable"
    note = (
        b": tapfix: could not recover tool call 'write' (arguments cut off inside a value);"
        b" passed through unchanged\n\n"
    )
    assert out.replace(note, b"") == data and note in out


# -- leaked calls ------------------------------------------------------------------------------------
LEAKS = [
    (
        "hermes after text",
        [
            "I'll read it.",
            "<tool_",
            'call>\n{"name": "read", "arguments": {"path": "a.py"}}',
            "\n</tool_call>",
        ],
        "I'll read it.",
        [("read", {"path": "a.py"})],
    ),
    (
        "two hermes calls",
        [
            '<tool_call>{"name": "read", "arguments": {"path": "a"}}</tool_call>\n<tool_call>'
            '{"name": "read", "arguments": "{\\"path\\": \\"b\\"}"}</tool_call>'
        ],
        "",
        [("read", {"path": "a"}), ("read", {"path": "b"})],
    ),
    (
        "qwen xml with code",
        [
            "<tool_call>\n<function=write>\n<parameter=path>\nx.py\n</parameter>\n",
            "<parameter=content>\n\n    if x:\n        return 1\n\n</parameter>\n</function>\n</tool_call>",
        ],
        "",
        [("write", {"path": "x.py", "content": "\n    if x:\n        return 1\n"})],
    ),
    (
        "qwen xml typed params",
        [
            "<function=grep>\n<parameter=pattern>\nTODO\n</parameter>\n<parameter=ignore_case>"
            '\ntrue\n</parameter>\n<parameter=globs>\n["*.py"]\n</parameter>\n</function>'
        ],
        "",
        [("grep", {"pattern": "TODO", "ignore_case": True, "globs": ["*.py"]})],
    ),
    ("mistral name[ARGS]", ["[TOOL_CALLS]read[ARGS]", '{"path": "m"}'], "", [("read", {"path": "m"})]),
    (
        "mistral list",
        [
            '[TOOL_CALLS][{"name": "read", "arguments": {"path": "1"}}, ',
            '{"name": "grep", "arguments": {"pattern": "p"}}]',
        ],
        "",
        [("read", {"path": "1"}), ("grep", {"pattern": "p"})],
    ),
    (
        "kimi",
        [
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.read:0<|tool_call_argument_begin|>",
            '{"path": "k"}<|tool_call_end|><|tool_calls_section_end|>',
        ],
        "",
        [("read", {"path": "k"})],
    ),
    (
        "raw json whole message",
        ['\n{"name": "read", ', '"arguments": {"path": "r"}}'],
        "\n",
        [("read", {"path": "r"})],
    ),
]


@pytest.mark.parametrize(("label", "texts", "left", "expected"), LEAKS, ids=[x[0] for x in LEAKS])
@pytest.mark.parametrize("seed", [0, 1])
def test_leaked_call_becomes_a_tool_call(label: str, texts: list, left: str, expected: list, seed: int) -> None:
    _, out, stage = run([ROLE, *[content(t) for t in texts], STOP], seed=seed)
    view = client_view(out)
    assert calls_of(out) == expected
    assert view.content == left and view.finish_reasons == ["tool_calls"]
    assert "leaked_into_content" in stage.defects


NOT_LEAKS = [
    ("unknown tool name", ['<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>']),
    ("arguments do not parse", ['<tool_call>{"name": "read", "arguments": {"path": </tool_call>']),
    ("plain json answer", ['{"name": "read", "arguments": "nope, a string"}']),
    ("marker mentioned in prose", ["To call a tool, write [TOOL_CALLS] then the name."]),
    # Issue 17's fence rule: a fenced block is a call only for a format whose call syntax is a fence,
    # opening with that format's tag. A ```json fence around {"name", "parameters"} is no registered
    # format's call syntax (llama3_json is bare JSON; xLAM's fence holds a list): it stays content.
    ("fenced json", ['```json\n{"name": "read", "parameters": {"path": "f"}}\n```']),
]


@pytest.mark.parametrize(("label", "texts"), NOT_LEAKS, ids=[x[0] for x in NOT_LEAKS])
def test_text_that_is_not_a_confirmed_leak_stays_content(label: str, texts: list) -> None:
    data, out, stage = run([ROLE, *[content(t) for t in texts], STOP])
    assert out == data and stage.outcome == "untouched"


def test_leaked_markup_lacking_a_required_argument_is_the_retryable_error() -> None:
    """The format reads the markup and its name is offered: a call, one that lost information (`write`
    requires `content`). Handing it out as text would lose the call silently: the retryable error."""
    _, out, stage = run([ROLE, content('[TOOL_CALLS]write{"path": "a"}'), STOP])
    view = client_view(out)
    assert view.errors and not view.calls and stage.outcome == "unrecoverable"
    assert "missing_fragment" in stage.defects and any(c.kind == "missing_fragment" for c in stage.changes)


def test_leak_detection_is_off_without_tools() -> None:
    data, out, _ = run(
        [ROLE, content('<tool_call>{"name": "read", "arguments": {"path": "a"}}</tool_call>'), STOP],
        tools=None,
    )
    assert out == data


def test_partial_marker_hold_is_released_when_clear() -> None:
    stage = ChatToolCallRepair(TOOLS)
    events = SSESplitter().feed(sse([ROLE, content("a <tool"), content("box> b"), STOP]))
    assert stage.feed(events[0]) == [events[0]]
    assert stage.feed(events[1]) == []
    assert stage.feed(events[2]) == events[1:3]
    assert stage.feed(events[3]) == [events[3]]


# -- calls that survive only inside an upstream error (llama-server) -------------------------------------
EDIT = tool("edit", {"path": {"type": "string"}, "edits": {"type": "array"}}, ["path", "edits"])
RAW = (
    '\n<tool_call>\n<function=edit>\n<parameter=edits>\n[{"newText": "named "pi" here", "oldText": "x"}]\n'
    "</parameter>\n</function>\n</tool_call>"
)


def test_call_recovered_from_upstream_error() -> None:
    stream = [
        ROLE,
        call(0, "e1", "edit", '{"path": "/a/USER.md", "edits": '),
        {
            "error": {
                "code": 500,
                "message": "Failed to parse input at pos 1192: " + RAW,
                "type": "server_error",
            }
        },
    ]
    _, out, stage = run(stream, tools=[EDIT])
    view = client_view(out)
    assert calls_of(out) == [
        ("edit", {"path": "/a/USER.md", "edits": [{"newText": 'named "pi" here', "oldText": "x"}]})
    ]
    assert not view.errors and view.done == 1 and view.finish_reasons == ["tool_calls"]
    assert stage.outcome == "recovered_from_error"
    assert any(c.kind == "upstream_error" for c in stage.changes)


def test_other_upstream_errors_pass_through() -> None:
    stream = [ROLE, content("hi"), {"error": {"code": 500, "message": "CUDA out of memory"}}]
    data, out, stage = run(stream)
    assert out == data and stage.outcome == "untouched"


# -- keep-alive ----------------------------------------------------------------------------------------
def test_keepalive_while_holding() -> None:
    now = [0.0]
    stage = ChatToolCallRepair(TOOLS, clock=lambda: now[0])
    events = SSESplitter().feed(
        sse([call(0, "c1", "write", '{"path": "a", '), call(0, arguments='"content": "b"}'), TOOL_FINISH])
    )
    assert stage.feed(events[0]) == []
    now[0] = 11.0
    assert stage.feed(events[1]) == [b": tapfix: holding tool call\n\n"]
    now[0] = 12.0
    assert stage.feed(events[2]) == events[:3]


@pytest.mark.parametrize("prefix", [False, True], ids=["held", "stream_valid_prefix"])
def test_a_stream_cut_inside_an_event_never_merges_the_repair_into_it(prefix: bool) -> None:
    """The upstream dies after `data` (an unterminated event): what tapfix writes after it at the end
    (a repaired call, its finish) must start a new event, or the client reads one garbage line and
    the call is lost (found by the prefix property: a silent empty turn in both modes)."""
    data = sse([ROLE, call(0, "c1", "read", '{"path": '), call(0, arguments='"a.py"'), STOP])
    data = data[: data.rindex(b"data: ", 0, data.rindex(b"data: "))] + b"data"  # cut before the finish
    stage = ChatToolCallRepair(TOOLS, capture_id="cap", stream_valid_prefix=prefix)
    view = client_view(run_stage(stage, [data]))
    if view.errors:
        assert not view.calls or prefix  # prefix mode: what streamed before the error, which the SDK raises on
    else:
        assert [(c["name"], c["arguments"]) for c in view.calls] and all(json.loads(c["arguments"]) for c in view.calls)


def test_an_event_only_pythons_json_reads_is_judged_like_any_other() -> None:
    """orjson refuses a lone surrogate escape (`\\ud800`) that Python's json, and so the SDKs, read:
    the stage must read that fragment too, or a repair around it leaves it hanging off the call
    (found by the prefix property: a fragment the stage never saw broke the streamed arguments)."""
    lone = (
        b'data: {"id":"chatcmpl-u1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\\ud800y\\"}"}}]},"finish_reason":null}]}\n\n'
    )
    head = sse([ROLE, call(1, "c1", "write", '{"path": "a", "content": "x')], done=False)
    data = head + lone + sse([TOOL_FINISH])
    view = client_view(run_stage(ChatToolCallRepair(TOOLS, capture_id="cap"), [data]))
    assert not view.errors
    assert [(c["name"], json.loads(c["arguments"])) for c in view.calls] == [
        ("write", {"path": "a", "content": "x\ud800y"})
    ]
