"""Issue 31, item 5: a later attempt that answers in text alone (the model changed its mind) is the answer.

Attempt 1 says "I will create the file now." and cuts its call; attempt 2, sent from scratch, answers in
text only. Streamed, the client already read attempt 1's text: attempt 2's answer follows it, and the
turn ends as attempt 2 ended it (`stop`, `completed`, `end_turn`), on Chat Completions, Responses and
Messages through the real SDKs. The other side of the rule still holds: an attempt 2 that opens with its
own preamble and then calls the tool doesn't say the preamble again. Not streamed, the client read
nothing of attempt 1, so it gets attempt 2's answer whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.inproc.test_e2e_regenerate import rows
from tests.support.builders import streamed_case
from tests.support.inproc import InprocProxy, mock_and_proxy
from tests.support.sdk_turn import SURFACES, Surface, Turn, ask

PREAMBLE = ["I will ", "create ", "the file ", "now."]
ANSWER = "Actually, I cannot write files here; please create it yourself."
OTHER_PREAMBLE = ["Sure, ", "writing ", "it."]
CUT = ['{"filePath": "hello.txt", ', '"content": "Hello, wor']
WHOLE = ['{"filePath": "hello.txt", ', '"content": "Hello, world!\\n"}']


def rules(model: str, later: dict[str, Any]) -> list[dict[str, Any]]:
    first = streamed_case("chatcmpl-first", PREAMBLE, CUT, "length")
    return [
        {"when": {"model": model, "attempt": 1}, "do": "serve_case", "case": first},
        {"when": {"model": model}, "do": "serve_case", "case": later},
    ]


SCENARIO = {
    "rules": [
        *rules("text-answer", streamed_case("chatcmpl-text", [ANSWER], None, "stop")),
        *rules("preamble-then-call", streamed_case("chatcmpl-call", OTHER_PREAMBLE, WHOLE, "tool_calls")),
    ]
}
ENDS = {"chat": "stop", "responses": "completed", "messages": "end_turn"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocProxy]:
    tmp: Path = tmp_path_factory.mktemp("text-answer")
    with mock_and_proxy(tmp, SCENARIO, "--regenerate", "1", shared=True) as (_, handle):
        yield handle


def regenerated(proxy: InprocProxy, turn: Turn) -> tuple[dict[str, Any], dict[str, Any]]:
    assert turn.capture_id, turn
    parent, second = rows(proxy.extra["db"], turn.capture_id, 2)
    assert "regenerated" in json.loads(parent["flags"]) and second["attempt"] == 2 and second["status"] == 200
    return parent, second


@pytest.mark.parametrize("surface", SURFACES)
def test_streamed_a_text_answer_follows_what_the_client_read(proxy: InprocProxy, surface: Surface) -> None:
    turn = ask(proxy.url, surface, "text-answer", stream=True)
    assert turn.error is None, turn.error
    assert turn.text == "".join(PREAMBLE) + ANSWER, "attempt 2's answer, after attempt 1's text"
    assert turn.calls == [] and turn.end == ENDS[surface]
    parent, second = regenerated(proxy, turn)
    assert "toolcall_unrecoverable" not in json.loads(parent["flags"])
    assert not [c for c in second["changes"] if c["kind"] == "drop"], "nothing of attempt 2 was dropped"


@pytest.mark.parametrize("surface", SURFACES)
def test_streamed_a_preamble_before_a_call_is_not_said_twice(proxy: InprocProxy, surface: Surface) -> None:
    turn = ask(proxy.url, surface, "preamble-then-call", stream=True)
    assert turn.error is None, turn.error
    assert turn.text == "".join(PREAMBLE), "attempt 2's own preamble is a repeat: dropped"
    assert [name for name, _ in turn.calls] == ["write"] and turn.calls[0][1]["content"] == "Hello, world!\n"
    _, second = regenerated(proxy, turn)
    assert [c["kind"] for c in second["changes"]].count("drop") >= 1, second["changes"]


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize(
    ("model", "text", "calls"), [("text-answer", ANSWER, 0), ("preamble-then-call", "Sure, writing it.", 1)]
)
def test_not_streamed_the_client_gets_attempt_2s_answer(
    proxy: InprocProxy, surface: Surface, model: str, text: str, calls: int
) -> None:
    turn = ask(proxy.url, surface, model, stream=False)
    assert turn.error is None, turn.error
    assert turn.text == text and len(turn.calls) == calls
    regenerated(proxy, turn)
