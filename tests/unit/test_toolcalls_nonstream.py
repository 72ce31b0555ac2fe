"""The same repair on non-streamed chat.completion bodies, including every corpus case made whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tapfix.proxy.toolcalls import assemble_tool_calls, repair_chat_completion

from tests.conftest import corpus_dir  # noqa: E402
from tests.support.builders import message_tool_call as tc
from tests.support.builders import tool

CORPUS = corpus_dir()
TOOLS = [tool("read", {"path": {"type": "string"}, "n": {"type": "integer"}}, ["path"])]


def body(message: dict, finish: str = "tool_calls") -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-n",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        }
    ).encode()


def message_of(data: bytes) -> tuple[dict, str]:
    choice = json.loads(data)["choices"][0]
    return choice["message"], choice["finish_reason"]


def test_valid_body_is_returned_unchanged() -> None:
    original = body({"content": None, "tool_calls": [tc('{"path": "a"}')]})
    assert repair_chat_completion(original, TOOLS) == (original, [], "untouched")
    text = body({"content": '<b>hi</b> {"name": "Bob"}'}, "stop")
    assert repair_chat_completion(text, TOOLS) == (text, [], "untouched")
    assert repair_chat_completion(b"not json", TOOLS) == (b"not json", [], "untouched")


REPAIRS = [
    ({"tool_calls": [tc("{'path': 'a', 'n': '3'}")]}, [("read", {"path": "a", "n": 3})]),
    ({"tool_calls": [tc({"path": "o"})]}, [("read", {"path": "o"})]),
    ({"tool_calls": [tc('{"path": "a"}{"path": "a"}')]}, [("read", {"path": "a"})]),
    (
        {"tool_calls": [tc('{"path": "a"}'), tc('{"path": "b"}', id="c1")]},
        [("read", {"path": "a"}), ("read", {"path": "b"})],
    ),
    (
        {"content": '<tool_call>\n{"name": "read", "arguments": {"path": "x"}}\n</tool_call>'},
        [("read", {"path": "x"})],
    ),
    ({"content": '[TOOL_CALLS]read[ARGS]{"path": "m"}'}, [("read", {"path": "m"})]),
]


@pytest.mark.parametrize(("message", "expected"), REPAIRS)
def test_repairs(message: dict, expected: list) -> None:
    out, changes, outcome = repair_chat_completion(body(message, "stop"), TOOLS)
    msg, finish = message_of(out)
    assert outcome == "repaired" and changes and finish == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == expected
    assert len({c["id"] for c in msg["tool_calls"]}) == len(expected)
    assert not (msg.get("content") or "").strip()


@pytest.mark.parametrize("policy", ["error", "fail_fast", "passthrough"])
def test_unrecoverable(policy: str) -> None:
    original = body({"tool_calls": [tc('{"path": "a", "n": 1.')]})
    out, changes, outcome = repair_chat_completion(original, TOOLS, capture_id="k", policy=policy)
    assert outcome == "unrecoverable" and changes
    if policy == "passthrough":
        assert out == original
        return
    error = json.loads(out)["error"]
    assert error["tapfix"]["reason"] == "tool_call_unrecoverable"
    assert (error["code"] == 502) is (policy == "error")


def _whole_body(case: dict) -> bytes:
    """A corpus stream made into the non-streamed body a server would have returned."""
    chunks = [o for o in case["stream"] if "choices" in o]
    content = "".join((ch.get("delta") or {}).get("content") or "" for c in chunks for ch in c["choices"])
    calls = [tc(c["arguments"], c["id"], c["name"]) for c in assemble_tool_calls(chunks)]
    finish = next((ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")), "stop")
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
    ).encode()


SKIP = {  # not run as whole bodies: what only the stream shows: fragment boundaries, per-delta ids, the error event
    "duplicated_fragments__hermes_qwen25_partial_json_diff_and_final_resend.json",
    "args_as_object__litellm_ollama_chat_dict_args_index0_and_stop.json",
    "wrong_index_or_id__parallel_calls_both_index_0_dynamo.json",
    "invalid_json__unescaped_quotes_in_json_valued_xml_parameter_llamacpp.json",
    "leaked_into_content__hermes_literal_close_tag_inside_string_argument.json",
    "args_as_object__minimax_stream_object_delta_after_empty_string.json",
}


@pytest.mark.parametrize("path", [p for p in sorted(CORPUS.glob("*.json")) if p.name not in SKIP], ids=lambda p: p.stem)
def test_corpus_as_whole_bodies(path: Path) -> None:
    case = json.loads(path.read_text())
    out, changes, outcome = repair_chat_completion(_whole_body(case), case["tools"])
    if outcome == "unrecoverable":
        assert case["scoring"] in ("detect", "impossible")
        return
    msg, _ = message_of(out)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
    if case["scoring"] in ("repair", "passthrough"):
        assert got == [(c["name"], c["arguments"]) for c in case["expected"]]
