"""`tapfix mock`'s imitation of vLLM, checked against the real vLLM's bytes.

The mock stands in for vLLM in most of the suite, so what tapfix reads from an answer must have the same
shape there as on the real server: every chunk's keys in order with the type of each value (ids, the
fingerprint and the numbers by their form, not their value), per kind of chunk (the role chunk, reasoning,
content, a call's first delta and its argument deltas, the finish chunk, the usage chunk), streamed and not;
and vLLM's 400s for a body it can't read, byte for byte. The words differ (the mock has its own script), the
structure may not. The same question goes to both: a text answer, one that reasons, a call.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.process.vllm.engine import MODEL, VllmServer
from tests.process.vllm.wire import CHAT, TOOLS, WRITE_ARGS, ask, chat_body, hermes_call, parsed_events, think
from tests.support.inproc import InprocMock, start_mock

pytestmark = [pytest.mark.vllm]

MOCK_MODEL = "tapfix-mock"
# Strings whose form is the fact, not their value.
FORMS = {
    "completion id": re.compile(r"chatcmpl-[0-9a-f]{16}"),
    "tool call id": re.compile(r"chatcmpl-tool-[0-9a-f]{16}"),
    "fingerprint": re.compile(r"vllm-0\.32\.0-[0-9a-f]{8}"),
}


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocMock]:
    proc = start_mock(tmp_path_factory.mktemp("mock"))
    yield proc
    proc.stop()


def shape(value: Any) -> Any:
    """A JSON value's structure: keys in order, the type of each leaf, the form of ids."""
    if isinstance(value, dict):
        return tuple((k, shape(v)) for k, v in value.items())
    if isinstance(value, list):
        return ("list", tuple(dict.fromkeys(shape(v) for v in value)))
    if isinstance(value, str):
        return next((form for form, pattern in FORMS.items() if pattern.fullmatch(value)), "str")
    if isinstance(value, bool) or value is None:
        return value if value is None else "bool"
    return "number"


# A call's opening entry (`tool_calls` of a "call opens" delta, or of a folded one: vLLM's output collector
# merges the steps a slow reader hasn't taken yet, so on a busy machine the call may open in the same delta
# as the reasoning's end). Its shape is compared whichever chunk carried it.
OPENER_CALLS = "call opener's tool_calls"


def kind(chunk: dict[str, Any]) -> str:
    if not chunk["choices"]:
        return "usage"
    choice = chunk["choices"][0]
    delta = choice.get("delta") or {}
    if choice.get("finish_reason"):
        return "finish"
    if "role" in delta:
        return "role"
    if len([k for k in ("content", "reasoning", "tool_calls") if delta.get(k)]) > 1:
        return "folded"  # pieces of two kinds that arrived in one engine step (see `stream_shapes`)
    if delta.get("tool_calls"):
        return "call opens" if "id" in delta["tool_calls"][0] else "call arguments"
    return "reasoning" if "reasoning" in delta else "content"


def stream_shapes(body: bytes) -> dict[str, set[Any]]:
    """The shapes of a stream's chunks by kind. The finish chunk's delta is left out of its shape: vLLM
    sends it empty, or with the last piece of text or of a call's arguments when that token arrived with
    the finish (timing decides, so only the empty form is one the mock must match: `finish delta`). Likewise
    a delta that carries two kinds at once (the end of the reasoning and the start of the content, when
    `</think>` and the next token came in one step on a busy machine) is `folded`, which the mock needn't
    produce: only its keys are checked, and the shape of a call's opening entry when the call opened in it."""
    shapes: dict[str, set[Any]] = {}
    for _, data in parsed_events(body):
        if not isinstance(data, dict):
            continue
        chunk_kind = kind(data)
        if chunk_kind == "folded":
            assert set(data["choices"][0]["delta"]) <= {"content", "reasoning", "tool_calls"}, data
        if chunk_kind in ("folded", "call opens"):
            calls = data["choices"][0]["delta"].get("tool_calls")
            if calls and "id" in calls[0]:
                shapes.setdefault(OPENER_CALLS, set()).add(shape(calls))
        if chunk_kind == "finish":
            delta = data["choices"][0].pop("delta")
            if delta:
                assert set(delta) <= {"content", "reasoning", "tool_calls"}, delta
            else:
                shapes.setdefault("finish delta", set()).add(shape(delta))
        shapes.setdefault(chunk_kind, set()).add(shape(data))
    return shapes


# name -> (the real vLLM's request, the mock's request for the same kind of answer). The mock imitates vLLM
# with a tool-call and a reasoning parser (proxy/mock/chat.py): the `vllm` server's configuration.
QUESTIONS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "text": (
        chat_body([{"role": "user", "content": "hi"}], chat_template_kwargs={"enable_thinking": False}),
        {"model": MOCK_MODEL, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "reasoning": (
        chat_body([{"role": "user", "content": "hi"}]),
        {"model": MOCK_MODEL, "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high"},
    ),
    "call": (
        chat_body(ask("Create hello.py.", think() + hermes_call("write", WRITE_ARGS)), tools=TOOLS),
        {
            "model": MOCK_MODEL,
            "messages": [{"role": "user", "content": "Create hello.txt"}],
            "tools": TOOLS,
            "reasoning_effort": "high",
        },
    ),
}


# The kinds of chunk each answer must have on both, besides the role and finish chunks (and usage). Only
# what timing can't fold into the finish chunk: a short answer's text may all arrive with the finish.
EXPECTED = {"text": set(), "reasoning": {"reasoning"}, "call": {"reasoning", "call opens"}}


def both(vllm: VllmServer, mock: InprocMock, name: str, **extra: Any) -> tuple[httpx.Response, httpx.Response]:
    real, imitation = QUESTIONS[name]
    pairs = ((vllm.url, real), (mock.url, imitation))
    answers = [httpx.post(url + CHAT, json={**body, **extra}, timeout=120) for url, body in pairs]
    assert all(a.status_code == 200 for a in answers), [a.text[:300] for a in answers]
    assert answers[0].headers["content-type"] == answers[1].headers["content-type"]
    return answers[0], answers[1]


@pytest.mark.parametrize("usage", [True, False], ids=["include_usage", "no_usage"])
@pytest.mark.parametrize("name", list(QUESTIONS))
def test_streamed_chunks_have_vllms_shape(vllm: VllmServer, mock: InprocMock, name: str, usage: bool) -> None:
    extra: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True} if usage else None}
    real, imitation = both(vllm, mock, name, **extra)
    want, got = stream_shapes(real.content), stream_shapes(imitation.content)
    kinds = {"role", "finish"} | ({"usage"} if usage else set()) | EXPECTED[name]
    assert kinds <= set(got), set(got)
    assert kinds - {"call opens"} <= set(want), set(want)
    if "call opens" in kinds:  # the real call may have opened in a folded delta: its entry's shape is the fact
        assert want.get(OPENER_CALLS) and got[OPENER_CALLS] == want[OPENER_CALLS], (want, got)
    for chunk_kind in set(want) & set(got):
        assert got[chunk_kind] == want[chunk_kind], chunk_kind
    assert got["finish delta"] == {()}, "the mock ends with an empty delta, as vLLM does when no text rides along"
    assert real.content.endswith(b"data: [DONE]\n\n") and imitation.content.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("name", list(QUESTIONS))
def test_whole_answers_have_vllms_shape(vllm: VllmServer, mock: InprocMock, name: str) -> None:
    real, imitation = both(vllm, mock, name)
    assert shape(imitation.json()) == shape(real.json())


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"model": "M"}', b'{"model": "M", "stream": true}'],
    ids=["not_json", "no_messages", "stream"],
)
def test_a_body_vllm_cannot_read_gets_its_400_byte_for_byte(vllm: VllmServer, mock: InprocMock, body: bytes) -> None:
    headers = {"content-type": "application/json"}
    real = httpx.post(vllm.url + CHAT, content=body.replace(b"M", MODEL.encode()), headers=headers, timeout=60)
    imitation = httpx.post(mock.url + CHAT, content=body.replace(b"M", MOCK_MODEL.encode()), headers=headers)
    assert (real.status_code, imitation.status_code) == (400, 400)
    assert imitation.content == real.content
