"""Chat Completions (and legacy completions) assembly: a stream or body → one message.

Runs in the writer thread, off the event loop. Accumulates tool calls strictly by index, as a
spec-following client does, so the stored message is what a correct client would have built.

Each `choices[i].index` is its own message (`n > 1`): the result is the lowest index (choice 0),
and `Assembled.choices` lists every choice when there is more than one. Merging them would store
"Hello0Hello1…" and one tool call made of several choices' arguments, which no client built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from tapfix.proxy.assemble.result import Assembled
from tapfix.proxy.assemble.shapes import ARGUMENTS, CONTENT, Shape, learn, single_delta
from tapfix.proxy.sse import SSESplitter, event_data


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    index = delta.get("index", 0)
    if not isinstance(index, int):
        index = 0
    call = calls.setdefault(index, {"id": None, "name": "", "arguments": ""})
    if delta.get("id"):
        call["id"] = call["id"] or delta["id"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["name"] += function["name"]
    arguments = function.get("arguments")
    if arguments is not None:
        call.setdefault("_parts", []).append(
            arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
        )


def _joined(call: dict[str, Any]) -> dict[str, Any]:
    parts = call.pop("_parts", None)
    if parts:
        call["arguments"] += "".join(parts)
    return call


def _apply_choice(result: Assembled, calls: dict[int, dict[str, Any]], choice: dict[str, Any]) -> bool:
    """Fold one streamed choice into the message; True if it carried a token."""
    delta = choice.get("delta") or choice.get("message") or {}
    token = False
    if isinstance(delta, dict):
        if isinstance(delta.get("content"), str) and delta["content"]:
            result.append("content", delta["content"])
            token = True
        for key in ("reasoning", "reasoning_content"):
            if isinstance(delta.get(key), str) and delta[key]:
                result.append("reasoning", delta[key])
                token = True
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                _merge_tool_call(calls, call)
                token = True
    if "text" in choice and isinstance(choice["text"], str) and choice["text"]:  # legacy completions
        result.append("content", choice["text"])
        token = True
    if choice.get("finish_reason"):
        result.finish_reason = choice["finish_reason"]
    return token


class _Fold:
    """One stream or body: choice 0 folds into `result` itself (the common case costs nothing extra),
    any other index into its own `Assembled`."""

    def __init__(self) -> None:
        self.result = Assembled()
        self.states: dict[int, tuple[Assembled, dict[int, dict[str, Any]]]] = {0: (self.result, {})}
        self.seen: set[int] = set()  # indices that came in a choice (the fast path's content is choice 0's)

    def state(self, choice: dict[str, Any]) -> tuple[Assembled, dict[int, dict[str, Any]]]:
        index = choice.get("index", 0)
        if index.__class__ is not int:
            index = 0
        state = self.states.get(index)
        if state is None:
            state = self.states[index] = (Assembled(index=index), {})
        self.seen.add(index)
        return state

    def apply(self, choice: dict[str, Any]) -> bool:
        message, calls = self.state(choice)
        return _apply_choice(message, calls, choice)

    def finish(self) -> Assembled:
        result = self.result
        for message, calls in self.states.values():
            message.tool_calls = [_joined(calls[i]) for i in sorted(calls)]
            message.join_parts()
        seen = sorted(self.seen | ({0} if _has_any(result) else set()))
        if seen and seen != [0]:
            choices = [self.states[i][0] for i in seen]
            for message in choices:
                message.done, message.events = result.done, result.events
            if seen[0] != 0:  # no choice 0 at all: the lowest index stands for the answer
                for key in ("content", "reasoning", "tool_calls", "finish_reason", "index"):
                    setattr(result, key, getattr(choices[0], key))
                choices[0] = result
            result.choices = choices
        return result


def _has_any(message: Assembled) -> bool:
    return bool(message.content or message.reasoning or message.tool_calls or message.finish_reason)


def assemble_chat_sse(chunks: list[bytes]) -> Assembled:
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    payloads = _one_line_payloads(body)
    if payloads is None:
        return _assemble_events(chunks)
    fold = _Fold()
    result = fold.result
    result.events += len(payloads)
    first = None  # the index of the first event that carried a token
    loads, decode_error = orjson.loads, orjson.JSONDecodeError
    known: list[_Known] = []  # the shapes of this stream's events seen so far (shapes.py)
    tries = _SHAPE_TRIES
    for i, data in enumerate(payloads):
        folded, n = False, len(data)
        for prefix, suffix, head, tail, sink, any_text in known:
            if n > head + tail and data.startswith(prefix) and data.endswith(suffix):
                try:
                    text = loads(data[head : n - tail])
                except decode_error:
                    break
                if text.__class__ is str:  # the shape's event with this text: folded as the text alone
                    sink(text)
                    folded = True
                    if first is None and (text or any_text):
                        first = i
                break
        if folded:
            continue
        if data[:1] != b"{":
            if data.strip() == b"[DONE]":
                result.done = True
                continue
            obj = result.event_object(data)
            if obj is None:
                continue
        else:  # `event_object` inlined: this loop runs for every event of every stream the writer stores
            try:
                obj = loads(data)
            except decode_error:
                result.malformed_events += 1
                continue
        if _fold_object(fold, obj) and first is None:
            first = i
        if tries and len(known) < _SHAPES and (CONTENT in data or ARGUMENTS in data):
            tries -= 1
            shape = learn(data, obj)
            if shape is not None:
                known.append(_known(fold, shape))
    if first is not None:
        result.first_token_chunk = _chunk_of(sum(len(p) for p in payloads[: first + 1]) + 8 * (first + 1), chunks)
    return fold.finish()


_SHAPE_TRIES = 16  # events read whole while looking for shapes (a stream of another kind stops looking)
_SHAPES = 4  # content, and the fragments of a few parallel tool calls (each index is a shape of its own)
# A shape as the loop reads it: prefix, suffix, their lengths, what takes an event's text, whether an
# empty text is a token (a tool call's fragment is; an empty content delta isn't).
_Known = tuple[bytes, bytes, int, int, Callable[[str], object], bool]


def _known(fold: _Fold, shape: Shape) -> _Known:
    """`shape` (just learned from an event `_fold_object` folded) with what folds an event of it: the
    text appended where `_fold_object` would append it."""
    sink: Callable[[str], object]
    if shape.call is None:
        sink = fold.result.pieces("content").append
    else:
        calls, call = fold.states[0][1], shape.call
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        if not call.get("id") and not call["function"].get("name"):  # a fragment: its arguments' next piece
            sink = calls[index]["_parts"].append
        else:
            sink = lambda text: _merge_tool_call(calls, shape.call_with(text))  # noqa: E731
    return shape.prefix, shape.suffix, len(shape.prefix), len(shape.suffix), sink, shape.call is not None


def _one_line_payloads(body: bytes) -> list[bytes] | None:
    """The payloads of a stream whose every event is one `data: ...` line ended by one blank line, LF only
    (what vLLM, SGLang and llama.cpp send), split in one pass in C; None for any other framing (the
    splitter's walk reads it). Each event is then exactly `data: ` + payload + `\n\n`: the only LFs in
    the body are those of the separators, so none is inside a payload, and a payload is what `event_data`
    gives for its event."""
    if body[:6] != b"data: " or body[-2:] != b"\n\n" or b"\r" in body:
        return None
    payloads = body[6:-2].split(b"\n\ndata: ")
    return payloads if body.count(b"\n") == 2 * len(payloads) else None


def _chunk_of(end: int, chunks: list[bytes]) -> int:
    """The input chunk in which the event ending at byte `end` of the stream was complete: the splitter
    hands an event out with the chunk that brings its blank line."""
    seen = 0
    for index, chunk in enumerate(chunks):
        seen += len(chunk)
        if seen >= end:
            return index
    return len(chunks) - 1


FoldObject = Callable[[_Fold, dict[str, Any]], bool]


def _assemble_events(chunks: list[bytes], fold_object: FoldObject | None = None) -> Assembled:
    """Any framing (CRLF, comments, multi-line data, an unterminated tail): event by event, as the splitter
    hands them out with the chunk that completed each. `fold_object`: `_fold_object` unless a test asks
    for the general walk alone."""
    fold = _Fold()
    splitter = SSESplitter()
    for chunk_index, events in enumerate([*(splitter.feed(c) for c in chunks), splitter.flush()]):
        for event in events:
            _fold_event(fold, event, min(chunk_index, len(chunks) - 1), fold_object or _fold_object)
    return fold.finish()


def _fold_event(fold: _Fold, event: bytes, chunk_index: int, fold_object: FoldObject) -> None:
    result = fold.result
    data = event_data(event)
    if data is None:
        return
    result.events += 1
    if data[:1] != b"{" and data.strip() == b"[DONE]":
        result.done = True
        return
    obj = result.event_object(data)
    if obj is not None and fold_object(fold, obj) and result.first_token_chunk is None:
        result.first_token_chunk = chunk_index


def _fold_object(fold: _Fold, obj: dict[str, Any]) -> bool:
    """Fold one event's object into the answer; True if it carried a token. Most events are choice 0
    carrying one content delta, or one fragment of a tool call's arguments: those are folded here without
    the general walk (this runs in the writer for every event of every stream), to the same result as
    `_fold_general`'s (tests/unit/test_assemble_chat.py)."""
    found = single_delta(obj)
    if found is not None:
        delta = found[1]
        text = delta.get("content")
        if text.__class__ is str:
            fold.seen.add(0)
            if text:
                fold.result.append("content", text)
                return True
            return False
        calls = delta.get("tool_calls")
        if calls.__class__ is list and len(calls) == 1 and calls[0].__class__ is dict:
            fold.seen.add(0)
            _merge_tool_call(fold.states[0][1], calls[0])
            return True
    return _fold_general(fold, obj)


def _fold_general(fold: _Fold, obj: dict[str, Any]) -> bool:
    result = fold.result
    if "error" in obj:
        result.error = obj["error"]
    if obj.get("usage"):
        result.usage = obj["usage"]
    if obj.get("timings").__class__ is dict:
        result.timings = obj["timings"]
    token = False
    choices = obj.get("choices")
    for choice in choices if choices.__class__ is list else ():
        if isinstance(choice, dict) and fold.apply(choice):
            token = True
    return token


def assemble_chat_json(obj: dict[str, Any]) -> Assembled:
    fold = _Fold()
    result = fold.result
    result.error = obj.get("error")
    result.usage = obj.get("usage")
    result.timings = obj["timings"] if isinstance(obj.get("timings"), dict) else None
    choices = obj.get("choices")
    for position, choice in enumerate(choices if isinstance(choices, list) else ()):
        if not isinstance(choice, dict):
            continue
        choice = choice if "index" in choice else {**choice, "index": position}
        message, calls = fold.state(choice)
        sent = choice.get("message") or {}
        if isinstance(sent, dict):
            for i, call in enumerate(sent.get("tool_calls") or ()):
                if isinstance(call, dict):
                    _merge_tool_call(calls, {**call, "index": call.get("index", i)})
            choice = {**choice, "message": {k: v for k, v in sent.items() if k != "tool_calls"}}
        _apply_choice(message, {}, choice)
    return fold.finish()
