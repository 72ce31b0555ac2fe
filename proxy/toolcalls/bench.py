"""Time the stage on one call with 1 KB, 100 KB and 1 MB arguments: `python -m tapfix.proxy.toolcalls.bench`.

`leak cut`: the call written as markup in the content and cut by max_tokens (the cut check of
`cutoff.py`); `prose, length`: prose of that size mentioning an opener every 40 characters, then max_tokens.

Each case is streamed as vLLM does (one small fragment per event, already split into events) and fed
through a fresh stage; the time is the stage's own work, per call and per event.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from tapfix.proxy.toolcalls.chat_stage import ChatToolCallRepair

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "write",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    }
]


def _event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-b",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def build(size: int, kind: str, fragment: int) -> list[bytes]:
    line = 'print("hello, world")  # a line of code with "quotes" and \\ slashes\n'
    content = (line * (size // len(line) + 1))[:size]
    args = json.dumps({"path": "big.py", "content": content})
    if kind == "repair":
        args = args[:-1] + ', "mode": True}'  # a Python literal: only the slow path can read it
    elif kind == "cut":
        args = args[: len(args) // 2]
    elif kind in ("leak cut", "prose, length"):  # a call as markup in the content, cut by max_tokens (cutoff.py)
        markup = '<tool_call>\n{"name": "write", "arguments": ' + args[: len(args) // 2]
        text = markup if kind == "leak cut" else ("Models wrap calls in <tool_call> tags. " * (size // 40 + 1))[:size]
        pieces = [_event({"content": text[i : i + fragment]}) for i in range(0, len(text), fragment)]
        return [_event({"role": "assistant", "content": ""}), *pieces, _event({}, "length"), b"data: [DONE]\n\n"]
    events = [
        _event({"role": "assistant", "content": ""}),
        _event(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "write", "arguments": ""},
                    }
                ]
            }
        ),
    ]
    events += [
        _event({"tool_calls": [{"index": 0, "function": {"arguments": args[i : i + fragment]}}]})
        for i in range(0, len(args), fragment)
    ]
    events.append(_event({}, "length" if kind == "cut" else "tool_calls"))
    events.append(b"data: [DONE]\n\n")
    return events


def time_case(events: list[bytes], tools: list[Any] | None = TOOLS, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        stage = ChatToolCallRepair(tools)
        start = time.perf_counter()
        for event in events:
            stage.feed(event)
        stage.flush()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fragment", type=int, default=16, help="argument characters per event")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'case':<28}{'events':>8}{'µs/call':>14}{'µs/event':>10}")
    for size in (1_000, 100_000, 1_000_000):
        for kind in ("valid", "repair", "cut", "leak cut", "prose, length"):
            events = build(size, kind, args.fragment)
            seconds = time_case(events, repeat=args.repeat)
            label = f"{size // 1000} KB {kind}"
            print(f"{label:<28}{len(events):>8}{seconds * 1e6:>14.0f}{seconds * 1e6 / len(events):>10.2f}")
    text = [_event({"content": "word "}) for _ in range(10_000)]
    # Prose as models stream it (a token's space first, a paragraph now and then): the fast path's deltas,
    # read into the context in batches.
    words = [" The", " answer", " is", " here", ",", " and", " it", " works", ".", "\n\n", "Next"] * 910
    prose = [_event({"content": w}) for w in words]
    cases = ((text, None, "content, no tools"), (text, TOOLS, "content, tools"), (prose, TOOLS, "prose, tools"))
    for events, tools, label in cases:
        seconds = time_case(events, tools, args.repeat)
        print(f"{label:<28}{len(events):>8}{seconds * 1e6:>14.0f}{seconds * 1e6 / len(events):>10.2f}")


if __name__ == "__main__":
    main()
