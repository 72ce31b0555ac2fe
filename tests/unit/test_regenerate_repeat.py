"""Issue 19's rule for what a later attempt forwards on Chat Completions: sent from scratch, its text of a
kind the client already read is not repeated and its tool calls go out; a continuation carries on."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.regenerate.splice import AttemptSplice

from tests.support.builders import chat_chunk, sse, tool, tool_call_chunk
from tests.support.stage_io import client_view
from tests.unit.test_regenerate_splice import FakeSession, regenerated

TOOLS = [tool("read", {"path": {"type": "string"}}, ["path"])]


def attempt(id: str, text: str, arguments: str, reasoning: str = "") -> bytes:
    opening = [chat_chunk({"role": "assistant", "content": ""}, id=id)]
    if reasoning:
        opening.append(chat_chunk({"reasoning_content": reasoning}, id=id))
    return sse(
        [
            *opening,
            chat_chunk({"content": text}, id=id),
            tool_call_chunk(0, f"c-{id}", "read", arguments, chunk_id=id),
            chat_chunk({}, "tool_calls", id=id),
        ]
    )


def run(attempts: list[bytes], engine: str | None, seed: int) -> tuple[bytes, FakeSession, AttemptSplice]:
    return regenerated(attempts, seed=seed, engine=engine)


def reasoning_of(view: Any) -> str:
    return "".join((ch.get("delta") or {}).get("reasoning_content") or "" for c in view.chunks for ch in c["choices"])


@given(st.integers(0, 10_000))
def test_from_scratch_the_text_the_client_read_is_not_said_again(seed: int) -> None:
    first = attempt("first", "Let me read it.", '{"pa', reasoning="I should read a.txt")
    second = attempt("second", "Sure, reading now.", '{"path": "a.txt"}', reasoning="The user wants a.txt")
    data, relay, splice = run([first, second], None, seed)
    view = client_view(data)
    assert view.content == "Let me read it." and reasoning_of(view) == "I should read a.txt"
    assert [c["arguments"] for c in view.calls] == ['{"path": "a.txt"}'] and view.errors == [] and view.done == 1
    assert relay.bodies[0]["messages"] == [{"role": "user", "content": "hi"}]  # from scratch
    drops = [c.path for d in splice.decisions for c in d.changes if c.kind == "drop"]
    assert drops == ["attempt[2].content", "attempt[2].reasoning"]


def test_what_the_client_did_not_read_still_goes_out() -> None:
    first = sse(
        [
            chat_chunk({"role": "assistant", "content": ""}, id="first"),
            tool_call_chunk(0, "c", "read", '{"pa', chunk_id="first"),
            chat_chunk({}, "length", id="first"),
        ]
    )
    second = attempt("second", "Reading a.txt.", '{"path": "a.txt"}', reasoning="The user wants a.txt")
    view = client_view(run([first, second], None, 0)[0])
    assert view.content == "Reading a.txt." and reasoning_of(view) == "The user wants a.txt"
    assert len(view.calls) == 1


def test_a_continuation_carries_on_from_the_clients_text() -> None:
    first = attempt("first", "Let me read", '{"pa')
    second = attempt("second", " it now.", '{"path": "a.txt"}')
    data, relay, splice = run([first, second], "llamacpp", 0)
    view = client_view(data)
    assert view.content == "Let me read it now." and len(view.calls) == 1
    assert relay.bodies[0]["continue_final_message"] is True
    assert not [c for d in splice.decisions for c in d.changes if c.kind == "drop"]
