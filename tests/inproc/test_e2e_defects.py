"""The table of truth through the real proxy (in the test process): every row, on every surface it covers,
as an SDK sees it.

One broken stream per (surface, row) from the defect generator (the same mutation functions as the
property tests and bench/repair_rates.py) is served by a byte-exact upstream, goes through a real
`tapfix run`, and is read by the openai SDK (Chat Completions, Responses) or the anthropic SDK
(Messages), assembling calls as an agent does. The row's outcome must be what the SDK gets: the
original calls for "repaired", the sent calls for "passed", an exception and no call for "detected".
"""

from __future__ import annotations

import json
import random
from typing import Any

import anthropic
import openai
import pytest
from tapfix.proxy.mock.defect_run import Example, applicable_example
from tapfix.proxy.mock.mutations_text import same_value
from tapfix.proxy.mock.mutations_turns import TurnSource, corpus_turns
from tapfix.proxy.toolcalls.defects import DEFECTS, SURFACES

from tests.conftest import corpus_dir
from tests.support.inproc import start_proxy
from tests.support.rawserver import RawRequest, RawServer, sse_response
from tests.support.sdk_turn import streamed_calls

ROWS = [(s, d) for d in DEFECTS for s in SURFACES if s in d.outcome]
PROMPT = "do it"


def _example(surface: str, row: str) -> Example:
    """The first applicable example of a fixed seed per (surface, row): the same stream every run."""
    source = TurnSource(corpus_turns(corpus_dir()))
    rng = random.Random(f"e2e:{surface}:{row}")
    example = applicable_example(rng, surface, source.draw, [row], tries=60)  # type: ignore[arg-type]
    assert example is not None, f"the generator has no {row} example for {surface}"
    return example


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    examples = {f"{s}-{d.id}": _example(s, d.id) for s, d in ROWS}

    def respond(request: RawRequest):
        key = json.loads(request.body)["model"]
        sent = examples[key].sent
        events = [e + b"\n\n" for e in sent.split(b"\n\n") if e.strip()]
        return sse_response(events)

    upstream = RawServer(respond)
    proxy = start_proxy(tmp_path_factory.mktemp("defects"), upstream.url, shared=True)
    yield proxy, examples
    proxy.stop()
    upstream.close()


def _chat(proxy, key: str, ex: Example) -> tuple[list[tuple[str, str]], Exception | None]:
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    try:
        stream = client.chat.completions.create(
            model=key, messages=[{"role": "user", "content": PROMPT}], tools=ex.tools, stream=True
        )
    except openai.APIError as e:
        return [], e
    calls, error = streamed_calls(stream)
    return [(c["name"], c["arguments"]) for c in calls], error


def _responses(proxy, key: str, ex: Example) -> tuple[list[tuple[str, str]], Exception | None]:
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    calls: list[tuple[str, str]] = []
    try:
        for event in client.responses.create(model=key, input=PROMPT, tools=ex.tools, stream=True):
            if event.type == "response.output_item.done" and event.item.type == "function_call":
                calls.append((event.item.name, event.item.arguments))
            if event.type == "response.failed":
                raise openai.APIError("response.failed", request=None, body=None)  # type: ignore[arg-type]
    except openai.APIError as e:
        return calls, e
    return calls, None


def _messages(proxy, key: str, ex: Example) -> tuple[list[tuple[str, str]], Exception | None]:
    client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
    blocks: dict[int, dict[str, Any]] = {}
    try:
        stream = client.messages.create(
            model=key,
            max_tokens=1024,
            messages=[{"role": "user", "content": PROMPT}],
            tools=ex.tools,  # type: ignore[arg-type]
            stream=True,
        )
        for event in stream:
            if event.type == "content_block_start" and event.content_block.type == "tool_use":
                blocks[event.index] = {"name": event.content_block.name, "parts": []}
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                blocks[event.index]["parts"].append(event.delta.partial_json)
    except anthropic.APIError as e:
        return [(b["name"], "".join(b["parts"]) or "{}") for _, b in sorted(blocks.items())], e
    return [(b["name"], "".join(b["parts"]) or "{}") for _, b in sorted(blocks.items())], None


CLIENTS = {"chat": _chat, "responses": _responses, "messages": _messages}


@pytest.mark.parametrize(("surface", "row"), ROWS, ids=[f"{s}-{d.id}" for s, d in ROWS])
def test_each_row_is_what_the_sdk_gets(stack, surface, row) -> None:
    proxy, examples = stack
    key = f"{surface}-{row.id}"
    ex = examples[key]
    calls, error = CLIENTS[surface](proxy, key, ex)
    outcome = row.outcome[surface]
    if outcome == "detected":
        assert error is not None and calls == [], (calls, ex.sent[-2000:])
        return
    assert error is None, (error, ex.sent[-2000:])
    assert [name for name, _ in calls] == [name for name, _ in ex.expected], ex.sent[-2000:]
    for (_, arguments), (_, expected) in zip(calls, ex.expected, strict=True):
        assert same_value(json.loads(arguments), expected), (arguments, expected)
