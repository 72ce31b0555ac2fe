"""Issue 31 item 1 through a real proxy: the field report's sentence reaches the openai SDK as text."""

from __future__ import annotations

import json
from typing import Any

import openai

from tests.support.inproc import start_proxy
from tests.support.rawserver import RawServer
from tests.unit.test_toolcalls_prose_rule import CALL, REPORTED, TOOLS, _answer


def test_the_reported_sentence_reaches_an_sdk_as_text_through_the_proxy(tmp_path: Any) -> None:
    """The field report's sentence, served by an upstream without a parser, with `write` and `bash`
    offered: through `tapfix run`, the openai SDK gets the sentence as content and no `bash` call,
    streamed and not; the same upstream's real leaked call still reaches it as a call."""
    upstream = RawServer(_answer)
    proxy = start_proxy(tmp_path, upstream.url)
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        for model, want_calls, want_text in (("reported", [], REPORTED), ("real", [CALL], "I'll clean up now.\n")):
            kw: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
            message = client.chat.completions.create(**kw).choices[0].message
            calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
            assert calls == want_calls and (message.content or "") == want_text
            text, parts = "", {}
            for event in client.chat.completions.create(**kw, stream=True):
                for choice in event.choices:
                    text += choice.delta.content or ""
                    for tc in choice.delta.tool_calls or []:
                        entry = parts.setdefault(tc.index, ["", ""])
                        entry[0] += (tc.function and tc.function.name) or ""
                        entry[1] += (tc.function and tc.function.arguments) or ""
            assert [(n, json.loads(a)) for n, a in parts.values()] == want_calls and text == want_text
    finally:
        proxy.stop()
        upstream.close()
