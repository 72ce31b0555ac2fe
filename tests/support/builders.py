"""The one home of the wire objects tests build: tool definitions, Chat Completions chunks and tool-call
deltas, SSE framing, and the mutators that split or corrupt a stream.

Tests compare bytes, so every builder keeps a fixed key order and takes a parameter wherever two tests
need different bytes (a chunk's id, `created`, the JSON spacing, the line ending); a module that always
wants the same variant binds it once with `functools.partial`. tests/unit/test_structure_builders.py fails
when a test module grows its own copy of one of these.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

import orjson
from tapfix.proxy.sse import SSESplitter, event_data

CHUNK_ID = "chatcmpl-test"
DONE = b"data: [DONE]\n\n"


# -- tool definitions and tool calls -----------------------------------------------------------------
def tool(
    name: str,
    properties: dict[str, Any] | None = None,
    required: list[str] | None = None,
    *,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    **function_extra: Any,
) -> dict[str, Any]:
    """An OpenAI Chat Completions tool definition (`{"type": "function", "function": {...}}`).

    `parameters` is `{"type": "object"}` plus `properties` and `required` only when given, so a test
    that sends a schema without `required` keeps sending exactly that; a whole schema given as
    `parameters=` is used as is. `function_extra` (e.g. `strict=False`) follows `parameters`."""
    if parameters is None:
        parameters = {"type": "object"}
        if properties is not None:
            parameters["properties"] = properties
        if required is not None:
            parameters["required"] = required
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = parameters
    return {"type": "function", "function": function | function_extra}


# The file-writing tool agents offer, as a request names it: the mock's scripted calls fill in its path and content.
WRITE_FILE = tool(
    "write",
    {"path": {"type": "string"}, "content": {"type": "string"}},
    ["path", "content"],
    description="Write a file",
)


def tool_call_delta(
    index: int | None,
    id: str | None = None,
    name: str | None = None,
    arguments: Any = None,
    *,
    typed: bool = True,
) -> dict[str, Any]:
    """One entry of a streamed `delta.tool_calls`: the opener carries `id` (and `"type": "function"`
    unless `typed=False`) and the name, later fragments only `arguments`. `index=None` leaves the
    index out, as some engines do; `arguments` may be a non-string to model a broken engine."""
    delta: dict[str, Any] = {} if index is None else {"index": index}
    if id is not None:
        delta["id"] = id
        if typed:
            delta["type"] = "function"
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    delta["function"] = function
    return delta


def message_tool_call(arguments: Any, id: str = "c1", name: str = "read") -> dict[str, Any]:
    """A whole tool call as a non-streamed `message.tool_calls` entry holds it."""
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


# -- Chat Completions chunks -------------------------------------------------------------------------
def chat_chunk(
    delta: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    *,
    id: str = CHUNK_ID,
    created: int | None = 1,
    model: str = "m",
    index: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """A `chat.completion.chunk` with one choice, keys in the order vLLM sends them; `extra` (e.g.
    `usage=`) goes after `choices`. `created=None` leaves `created` out."""
    chunk: dict[str, Any] = {"id": id, "object": "chat.completion.chunk"}
    if created is not None:
        chunk["created"] = created
    chunk["model"] = model
    chunk["choices"] = [{"index": index, "delta": delta or {}, "finish_reason": finish_reason}]
    return chunk | extra


def tool_call_chunk(
    index: int | None,
    id: str | None = None,
    name: str | None = None,
    arguments: Any = None,
    *,
    typed: bool = True,
    chunk_id: str = CHUNK_ID,
) -> dict[str, Any]:
    """A chunk whose delta holds one tool-call delta (see `tool_call_delta`)."""
    delta = tool_call_delta(index, id, name, arguments, typed=typed)
    return chat_chunk({"tool_calls": [delta]}, id=chunk_id)


def streamed_case(
    cid: str, text: list[str], arguments: list[str] | None, finish: str, *, name: str = "write"
) -> dict[str, Any]:
    """A mock `serve_case` case (the mock draws it on every surface): a streamed chat answer of `text`
    pieces, then, unless `arguments` is None, one `name` call whose arguments arrive in those pieces."""
    events = [chat_chunk({"role": "assistant", "content": ""}, id=cid)]
    events += [chat_chunk({"content": piece}, id=cid) for piece in text]
    if arguments is not None:
        events.append(chat_chunk({"tool_calls": [tool_call_delta(0, f"call-{cid}", name, "")]}, id=cid))
        events += [chat_chunk({"tool_calls": [tool_call_delta(0, arguments=a)]}, id=cid) for a in arguments]
    return {"stream": [*events, chat_chunk({}, finish, id=cid)]}


# -- whole answers -----------------------------------------------------------------------------------
def messages_answer(text: str = "ok", model: str = "qwen3", id: str = "msg_1") -> dict[str, Any]:
    """A whole, non-streamed Anthropic Messages answer: one text block, ended by the model."""
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }


# -- SSE framing -------------------------------------------------------------------------------------
def sse_event(
    obj: dict[str, Any] | bytes,
    *,
    newline: str = "\n",
    ensure_ascii: bool = False,
    separators: tuple[str, str] = (",", ":"),
) -> bytes:
    """`data: <json>` and a blank line. The default is vLLM's and SGLang's framing (compact JSON,
    UTF-8 as is); `bytes` are taken as an already serialized payload."""
    if isinstance(obj, bytes):
        payload = obj
    else:
        payload = json.dumps(obj, ensure_ascii=ensure_ascii, separators=separators).encode()
    end = newline.encode()
    return b"data: " + payload + end + end


def named_event(obj: dict[str, Any]) -> bytes:
    """A Responses/Messages event: `event: <its type>` then `data: <json>` and a blank line."""
    return f"event: {obj['type']}\ndata: {json.dumps(obj)}\n\n".encode()


def sse_events(objects: Iterable[dict[str, Any] | bytes], *, done: bool = True, newline: str = "\n") -> list[bytes]:
    """One event per object (see `sse_event`), then `data: [DONE]` unless `done=False`."""
    events = [sse_event(obj, newline=newline) for obj in objects]
    if done:
        events.append(sse_event(b"[DONE]", newline=newline))
    return events


def sse(objects: Iterable[dict[str, Any] | bytes], *, done: bool = True, newline: str = "\n") -> bytes:
    """A whole stream body: `sse_events` joined."""
    return b"".join(sse_events(objects, done=done, newline=newline))


def sse_json(data: bytes) -> list[Any]:
    """The inverse, for assertions: every event's parsed `data` payload (comments and empty ones skipped)."""
    splitter = SSESplitter()
    return [_loads(payload) for event in splitter.feed(data) + splitter.flush() if (payload := event_data(event))]


def _loads(payload: bytes) -> Any:
    """orjson where it reads the payload (the sweeps parse every event of thousands of streams), else the json
    module, which also reads what orjson refuses (a lone surrogate escape, NaN, an integer past 64 bits)."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload)


# -- stream mutators ---------------------------------------------------------------------------------
def random_splits(data: bytes, rng: random.Random, max_piece: int = 40) -> list[bytes]:
    """`data` cut into pieces of 1 to `max_piece` bytes, as a network hands them over."""
    pieces = []
    pos = 0
    while pos < len(data):
        step = rng.randint(1, max_piece)
        pieces.append(data[pos : pos + step])
        pos += step
    return pieces


def rechunk(data: bytes, rng: random.Random, sizes: list[int]) -> list[bytes]:
    """`data` cut into pieces whose sizes are drawn from `sizes` (mixes single bytes with large reads)."""
    out, i = [], 0
    while i < len(data):
        n = rng.choice(sizes)
        out.append(data[i : i + n])
        i += n
    return out


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """`data` cut at the given offsets (taken modulo `len(data) + 1`, so any integers do); the first
    and last piece may be empty."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def split_every(data: bytes, n: int) -> list[bytes]:
    """`data` in pieces of `n` bytes (the last one shorter)."""
    return [data[i : i + n] for i in range(0, len(data), n)]


def split_arguments(text: str, rng: random.Random, max_cuts: int) -> list[str]:
    """A tool call's argument text as up to `max_cuts + 1` streamed fragments, cut anywhere."""
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, max_cuts))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def corrupt_events(data: bytes, rng: random.Random, *, finish_to_length: bool = False) -> bytes:
    """1 to 4 event-level defects: drop, duplicate, cut bytes out of or truncate an event, or break an
    argument string's opening quote; with `finish_to_length`, also turn `tool_calls` into `length`."""
    events = data.split(b"\n\n")
    ops = 6 if finish_to_length else 5
    for _ in range(rng.randint(1, 4)):
        k = rng.randrange(len(events))
        op = rng.randrange(ops)
        if op == 0:
            del events[k]
        elif op == 1:
            events.insert(k, events[rng.randrange(len(events))])
        elif op == 2 and events[k]:
            a = rng.randrange(len(events[k]))
            events[k] = events[k][:a] + events[k][a + rng.randint(1, 8) :]
        elif op == 3:
            events[k] = events[k].replace(b'"arguments":"', b'"arguments":"\\"', 1)
        elif op == 4 and finish_to_length:
            events[k] = events[k].replace(b'"finish_reason":"tool_calls"', b'"finish_reason":"length"')
        else:
            events[k] = events[k][: rng.randrange(len(events[k]) + 1)]
        if not events:
            break
    return b"\n\n".join(events)
