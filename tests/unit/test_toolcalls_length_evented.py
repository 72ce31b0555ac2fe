"""A turn that `max_tokens` ended, on the Responses and Messages surfaces (issue 31 items 10 and 13;
docs/repair.md, "A turn max_tokens ended"), streamed (deltas split inside the markup) and not.

A text part that ended inside a call's markup is that call cut: the retryable error when the turn ended
by `max_tokens` (`response.incomplete`, `stop_reason: max_tokens`), text as it came when it ended
otherwise. Complete calls, leaked or structured, keep `tool_use` (Messages' finish rewrite) and go out
(Responses) only when nothing says more was coming: text after the last call, a calls section left open,
or a call whose block or item never ended make the turn the error. The answers are rendered by the mock
(`Script`) as the surfaces' servers send them.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from tapfix.proxy.mock.messages import messages_body, messages_events
from tapfix.proxy.mock.responses import responses_body, responses_events
from tapfix.proxy.mock.surface_script import Part, Script
from tapfix.proxy.toolcalls import (
    MessagesToolCallRepair,
    ResponsesToolCallRepair,
    repair_messages_body,
    repair_responses_body,
)

from tests.support.builders import sse_json as events
from tests.unit.test_toolcalls_invariants_evented import messages_view, responses_view
from tests.unit.test_toolcalls_length import BASH, HERMES_CUT, PROSE, WRITE

R_TOOLS = [{"type": "function", **t["function"]} for t in (WRITE, BASH)]
M_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in (WRITE, BASH)]
HERMES_LS = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
KIMI_LS = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>"
    '{"command": "ls"}<|tool_call_end|>'
)
LS = '{"command": "ls"}'


def cut_up(text: str) -> list[str]:
    """Deltas of 1 to 7 characters, cutting every marker somewhere."""
    out, pos, size = [], 0, 1
    while pos < len(text):
        out.append(text[pos : pos + size])
        pos, size = pos + size, size % 7 + 1
    return out


def script(*parts: Part, finish: str) -> Script:
    return Script(list(parts), finish, 9)


def text(t: str) -> Part:
    return Part("text", cut_up(t))


def use(name: str, args: str, call_id: str = "call_a") -> Part:
    return Part("call", [args[:5], args[5:]] if args else [], call_id, name)


def run(stage: Any, evs: list[bytes]) -> bytes:
    out: list[bytes] = []
    for raw in evs:
        out += stage.feed(raw)
    return b"".join(out + stage.flush())


def responses(s: Script, drop: str | None = None) -> tuple[bytes, ResponsesToolCallRepair]:
    evs = responses_events(s, {"tools": R_TOOLS}, "e" * 64, 1_760_000_000, "m", 10)
    if drop is not None:  # the last event of that type: a stream that stopped before it
        last = max(k for k, e in enumerate(evs) if e.startswith(f"event: {drop}\n".encode()))
        evs = evs[:last] + evs[last + 1 :]
    stage = ResponsesToolCallRepair(R_TOOLS, capture_id="cap-31")
    return run(stage, evs), stage


def messages(s: Script, drop: str | None = None) -> tuple[bytes, MessagesToolCallRepair]:
    evs = messages_events(s, "e" * 64, "m", 10)
    if drop is not None:
        last = max(k for k, e in enumerate(evs) if e.startswith(f"event: {drop}\n".encode()))
        evs = evs[:last] + evs[last + 1 :]
    stage = MessagesToolCallRepair(M_TOOLS, capture_id="cap-31")
    return run(stage, evs), stage


def failed_r(data: bytes) -> bool:
    kinds = [e["type"] for e in events(data)]
    calls = [e for e in events(data) if e["type"] == "response.output_item.done" and e["item"]["type"] != "message"]
    return "error" in kinds and "response.failed" in kinds and not calls and "response.incomplete" not in kinds


def failed_m(data: bytes) -> bool:
    view = messages_view(data)
    return bool(view["errors"]) and view["calls"] == [] and view["stop"] is None


def r_text(data: bytes) -> str:
    return "".join(e["delta"] for e in events(data) if e["type"] == "response.output_text.delta")


def m_text(data: bytes) -> str:
    return "".join(
        e["delta"]["text"]
        for e in events(data)
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )


# -- item 10: a leaked call cut ----------------------------------------------------------------------
CUT = {
    "hermes": HERMES_CUT,
    "prose, then hermes": "I'll write it.\n\n" + HERMES_CUT,
    "harmony's second call": (
        f" to=functions.bash<|channel|>commentary json<|message|>{LS}<|call|>"
        '<|start|>assistant to=functions.write<|channel|>commentary json<|message|>{"filePath": "a'
    ),
    "mistral": '[TOOL_CALLS]write[ARGS]{"filePath": "a.txt", "content": "hi',
}


@pytest.mark.parametrize("markup", CUT.values(), ids=CUT.keys())
def test_a_leaked_call_cut_by_max_tokens_is_the_error_on_responses(markup: str) -> None:
    data, stage = responses(script(text(markup), finish="length"))
    assert failed_r(data) and stage.outcome == "unrecoverable" and "missing_last_chunk" in stage.defects
    body, changes, outcome = repair_responses_body(
        responses_body(script(text(markup), finish="length"), {"tools": R_TOOLS}, "e" * 64, 1, "m", 10), R_TOOLS
    )
    assert outcome == "unrecoverable" and "max_tokens reached" in orjson.loads(body)["error"]["message"]


@pytest.mark.parametrize("markup", CUT.values(), ids=CUT.keys())
def test_a_leaked_call_cut_by_max_tokens_is_the_error_on_messages(markup: str) -> None:
    data, stage = messages(script(text(markup), finish="length"))
    assert failed_m(data) and stage.outcome == "unrecoverable" and "missing_last_chunk" in stage.defects
    body, _, outcome = repair_messages_body(
        messages_body(script(text(markup), finish="length"), "e" * 64, "m", 10), M_TOOLS
    )
    error = orjson.loads(body)
    assert outcome == "unrecoverable" and error["type"] == "error" and "max_tokens reached" in error["error"]["message"]


@pytest.mark.parametrize("finish", ["length", "stop"])
@pytest.mark.parametrize("prose", PROSE)
def test_prose_passes_as_it_came(prose: str, finish: str) -> None:
    r_data, r_stage = responses(script(text(prose), finish=finish))
    m_data, m_stage = messages(script(text(prose), finish=finish))
    assert r_text(r_data) == prose and m_text(m_data) == prose
    assert r_stage.outcome == m_stage.outcome == "untouched"


def test_a_cut_call_in_a_turn_that_ended_otherwise_is_text() -> None:
    """Only max_tokens makes it the error: the held text then goes out as it came."""
    r_data, _ = responses(script(text(HERMES_CUT), finish="stop"))
    m_data, _ = messages(script(text(HERMES_CUT), finish="stop"))
    assert r_text(r_data) == HERMES_CUT and m_text(m_data) == HERMES_CUT


def test_the_end_of_the_stream_before_the_turn_ended_is_the_error() -> None:
    """A text that ended inside a call's markup, then the connection closed: the call was cut."""
    r_data, _ = responses(script(text(HERMES_CUT), finish="stop"), drop="response.completed")
    m_data, _ = messages(script(text(HERMES_CUT), finish="stop"), drop="message_delta")
    assert failed_r(r_data) and messages_view(m_data)["errors"]


# -- item 13: complete calls, then max_tokens --------------------------------------------------------
SIGNS: dict[str, tuple[tuple[Part, ...], str | None]] = {
    "text after the last call": ((use("bash", LS), text("Now I will")), None),
    "a leaked call, then prose": ((text(HERMES_LS + "\nNow I will"),), None),
    "a leaked call, then an opener": ((text(HERMES_LS + "\n<tool_call>"),), None),
    "kimi's calls section left open": ((text(KIMI_LS),), None),
}


@pytest.mark.parametrize(("parts", "drop"), SIGNS.values(), ids=SIGNS.keys())
def test_a_sign_that_more_was_coming_is_the_error(parts: tuple[Part, ...], drop: str | None) -> None:
    r_data, _ = responses(script(*parts, finish="length"), drop)
    m_data, _ = messages(script(*parts, finish="length"), drop)
    assert failed_r(r_data) and failed_m(m_data)
    responses_view(r_data)  # what the client still gets keeps its output indexes dense (the call dropped)


def test_a_call_whose_end_never_came_is_the_error() -> None:
    """A parallel batch's next call was opened (its input reads whole: `{}`), then max_tokens."""
    parts = (use("bash", LS), use("bash", "", "call_b"))
    r_data, _ = responses(script(*parts, finish="length"), drop="response.output_item.done")
    m_data, _ = messages(script(*parts, finish="length"), drop="content_block_stop")
    assert failed_r(r_data) and failed_m(m_data)


COMPLETE: dict[str, tuple[Part, ...]] = {
    "one structured call": (use("bash", LS),),
    "two structured calls": (use("bash", LS), use("bash", '{"command": "pwd"}', "call_b")),
    "text, then a call": (text("Listing."), use("bash", LS)),
    "a leaked call": (text("Listing.\n" + HERMES_LS),),
    "kimi's calls section closed": (text(KIMI_LS + "<|tool_calls_section_end|>"),),
}


@pytest.mark.parametrize("parts", COMPLETE.values(), ids=COMPLETE.keys())
def test_complete_calls_and_nothing_after_go_out(parts: tuple[Part, ...]) -> None:
    m_data, _ = messages(script(*parts, finish="length"))
    view = messages_view(m_data)
    assert view["errors"] == [] and view["calls"] and view["stop"] == "tool_use"
    r_data, _ = responses(script(*parts, finish="length"))
    r_view = responses_view(r_data)
    assert r_view["errors"] == [] and r_view["calls"]


def test_the_bodies_read_the_same_signs() -> None:
    cases = {
        "text after the call": ((use("bash", LS), text("Now I will")), True),
        "kimi open": ((text(KIMI_LS),), True),
        "a call alone": ((use("bash", LS),), False),
    }
    for name, (parts, cut) in cases.items():
        s = script(*parts, finish="length")
        _, _, m_outcome = repair_messages_body(messages_body(s, "e" * 64, "m", 10), M_TOOLS)
        _, _, r_outcome = repair_responses_body(responses_body(s, {"tools": R_TOOLS}, "e" * 64, 1, "m", 10), R_TOOLS)
        assert (m_outcome == "unrecoverable") == cut and (r_outcome == "unrecoverable") == cut, name
