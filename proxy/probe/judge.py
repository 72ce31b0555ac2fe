"""How the probe judges an answer: coherent text, a well-formed stream, a valid tool call.

Separate from the checks (which only build requests) so the rules can be tested on plain strings
and reused by anything that wants the same verdict on a captured answer. The degeneration
detectors are the store's own (`proxy/assemble/degeneration.py`), so a probe failure and a capture flag
agree on what "drifts" and "loops" mean.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from tapfix.proxy.assemble.degeneration import latin_dominant, repetition_loop, script_drift
from tapfix.proxy.probe.client import shorten
from tapfix.proxy.sse import SSESplitter, event_data

THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.S)


def judge_text(
    content: str,
    reasoning: str,
    finish: str | None,
    max_tokens: int,
    expect: str | None = None,
    expect_label: str = "",
) -> str | None:
    """Why an answer to a plain English prompt is not a coherent answer, or None if it is."""
    text = visible(content)
    if not text.strip():
        if reasoning and finish == "length":
            return f"no answer: all {max_tokens} tokens went to reasoning (finish_reason length)"
        return f"the answer is empty (finish_reason {finish}, {len(reasoning)} chars of reasoning)"
    if script_drift(text, conversation_latin=True) or latin_dominant(text) is False:
        first = re.search(r"[\u3000-\u9fff\uac00-\ud7af\uff00-\uffef]", text)
        at = first.start() if first else 0
        snippet = quote(text[max(0, at - 30) :], 90)
        return f"the answer drifts out of English into CJK script after {at} chars: {snippet}"
    if repetition_loop(text):
        line, count = _most_repeated(text)
        what = f"{quote(line, 60)} repeated {count} times" if count > 2 else quote(text[-80:], 80)
        return f"the answer loops: {what} (finish_reason {finish})"
    if finish == "length":
        return f"the answer did not end within {max_tokens} tokens (finish_reason length): {quote(text, 80)}"
    if expect and not re.search(expect, text, re.I):
        return f"the answer does not say {expect_label}: {quote(text, 100)}"
    return None


@dataclass(slots=True)
class StreamScan:
    events: int = 0
    bad: list[str] = field(default_factory=list)
    done: bool = False
    after_done: int = 0
    finish_reason: str | None = None
    error: str | None = None
    token_events: int = 0
    usage_tokens: int | None = None
    first: float | None = None
    last: float | None = None
    tail: bytes = b""
    text: str = ""

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens else self.token_events

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first is None else round(self.first * 1000, 1)

    @property
    def tokens_per_s(self) -> float | None:
        if self.first is None or self.last is None or self.last <= self.first or self.tokens < 2:
            return None
        return round((self.tokens - 1) / (self.last - self.first), 1)

    def problems(self) -> list[str]:
        out = list(self.bad[:2])
        if self.error:
            out.append(f"the stream carried an error: {self.error}")
        if self.tail.strip():
            out.append(f"the stream ended inside an event: {quote(self.tail.decode('utf-8', 'replace'), 60)}")
        if not self.done:
            out.append("the stream did not end with data: [DONE]")
        if self.after_done:
            out.append(f"{self.after_done} event(s) after [DONE]")
        if self.finish_reason is None:
            out.append("no finish_reason in any event")
        if not self.token_events:
            out.append("the stream carried no content")
        return out


def scan_stream(chunks: list[bytes], times: list[float]) -> StreamScan:
    """Check every event of an SSE body and time the tokens (times: seconds from the request)."""
    scan = StreamScan()
    splitter = SSESplitter()
    for chunk, at in zip(chunks, times, strict=False):
        for event in splitter.feed(chunk):
            _scan_event(scan, event, at)
    rest = splitter.flush()
    scan.tail = b"".join(rest)
    return scan


def _scan_event(scan: StreamScan, event: bytes, at: float) -> None:
    data = event_data(event)
    if data is None:
        return  # a comment (keep-alive)
    scan.events += 1
    if scan.done:
        scan.after_done += 1
        return
    if data.strip() == b"[DONE]":
        scan.done = True
        return
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        scan.bad.append(f"event {scan.events} is not JSON ({e}): {quote(data.decode('utf-8', 'replace'), 50)}")
        return
    if not isinstance(obj, dict):
        scan.bad.append(f"event {scan.events} is not a JSON object")
        return
    if "error" in obj:
        err = obj["error"]
        scan.error = shorten(str(err.get("message") if isinstance(err, dict) else err), 120)
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        scan.usage_tokens = usage["completion_tokens"]
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason"):
            scan.finish_reason = choice["finish_reason"]
        given = choice.get("delta")
        delta = given if isinstance(given, dict) else {}
        piece = "".join(v for k in ("content", "reasoning", "reasoning_content") if isinstance(v := delta.get(k), str))
        if piece or delta.get("tool_calls"):
            scan.token_events += 1
            scan.text += piece
            scan.first = at if scan.first is None else scan.first
            scan.last = at


def judge_tool_call(
    calls: list[dict[str, Any]], content: str, finish: str | None, name: str, schema: dict[str, Any]
) -> str | None:
    if not calls:
        leaked = "<tool_call>" in content or '"name"' in content
        where = " (the call leaked into the content: is the tool-call parser set?)" if leaked else ""
        return f"no tool call{where}: the model answered {quote(visible(content), 80)} (finish_reason {finish})"
    call = calls[0]
    if call.get("name") != name:
        return f"called {call.get('name')!r} instead of {name!r}"
    raw = call.get("arguments") or ""
    cut = f" (finish_reason {finish})" if finish == "length" else ""
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as e:
        return f"tool call arguments are not valid JSON: {e.msg} (char {e.pos}): {quote(raw, 70)}{cut}"
    if not isinstance(args, dict):
        return f"tool call arguments are not a JSON object: {quote(raw, 70)}"
    error = next(iter(Draft202012Validator(schema).iter_errors(args)), None)
    if error is not None:
        return f"tool call arguments do not match the schema: {error.message}"
    if finish not in ("tool_calls", "stop"):  # "stop": a named tool_choice on vLLM
        return f"the call ended with finish_reason {finish!r}"
    return None


def visible(content: str) -> str:
    """The answer without a `<think>` block (a server without a reasoning parser leaves it in)."""
    return THINK.sub("", content or "").strip()


def quote(text: str, limit: int) -> str:
    return repr(shorten(text, limit)) if text else "''"


def _most_repeated(text: str) -> tuple[str, int]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "", 0
    return Counter(lines).most_common(1)[0]
