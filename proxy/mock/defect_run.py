"""Run a mutated turn through the surface's repair stage and judge what a strict client receives.

`exact`: the client received exactly the original calls (same order and names, arguments equal as
JSON values, ids non-empty and unique, indexes dense from 0, the finish saying tool calls), or for a
call renamed to a tool that isn't offered, exactly that name. `error`: the retryable error and no
call. `wrong`: anything else (a different or missing call, an empty tool-call turn, broken JSON
handed out, wrong indexes, a finish that disagrees). A preserving composition must be `exact`; a
destroying one may be `exact` or `error`, never `wrong`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tapfix.proxy.mock.mutations import Mutate, compose, preserves
from tapfix.proxy.mock.mutations_leak import DecoyKind, decoy_wire, leak_of
from tapfix.proxy.mock.mutations_text import same_value
from tapfix.proxy.mock.mutations_wire import Surface, Turn, new_wire, serialize, surface_tools
from tapfix.proxy.sse import SSESplitter, event_data
from tapfix.proxy.toolcalls import stage_for
from tapfix.proxy.toolcalls.accumulate import assemble_tool_calls

Outcome = Literal["exact", "error", "wrong"]
CAPTURE_ID = "cap-defects"


@dataclass
class Received:
    """What a strict client of the surface assembles."""

    calls: list[dict[str, Any]] = field(default_factory=list)  # id, name, arguments (text)
    errors: list[Any] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # structure a client would trip on
    finish: str | None = None


def run_stage(surface: Surface, tools: list[dict[str, Any]], data: bytes) -> bytes:
    stage = stage_for(surface, tools, "error", CAPTURE_ID)
    assert stage is not None, surface
    splitter = SSESplitter()
    out: list[bytes] = []
    for event in splitter.feed(data) + splitter.flush():
        out += stage.feed(event)
    out += stage.flush()
    return b"".join(out)


def _events(data: bytes) -> list[tuple[bytes, Any]]:
    splitter = SSESplitter()
    out = []
    for event in splitter.feed(data) + splitter.flush():
        payload = event_data(event)
        if payload is None:
            continue
        if payload.strip() == b"[DONE]":
            out.append((event, "[DONE]"))
            continue
        out.append((event, json.loads(payload)))
    return out


def _dense(indexes: list[Any]) -> bool:
    seen = list(dict.fromkeys(indexes))
    return seen == list(range(len(seen)))


def _chat(data: bytes) -> Received:
    got = Received()
    chunks = []
    done = 0
    indexes: list[Any] = []
    for _, obj in _events(data):
        if obj == "[DONE]":
            done += 1
            continue
        if done:
            got.problems.append("an event after [DONE]")
        if "error" in obj and "choices" not in obj:
            got.errors.append(obj["error"])
            continue
        chunks.append(obj)
        for choice in obj.get("choices") or []:
            for entry in (choice.get("delta") or {}).get("tool_calls") or []:
                indexes.append(entry.get("index"))
            if choice.get("finish_reason"):
                got.finish = choice["finish_reason"]
    got.calls = assemble_tool_calls(chunks)
    if done != 1:
        got.problems.append(f"{done} [DONE]")
    if not _dense(indexes):
        got.problems.append(f"indexes {list(dict.fromkeys(indexes))}")
    _finish_agrees(got, "tool_calls")
    return got


def _responses(data: bytes) -> Received:
    got = Received()
    deltas: dict[Any, str] = {}
    added: list[Any] = []
    completed: list[dict[str, Any]] | None = None
    for _, obj in _events(data):
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind in ("error", "response.failed"):
            got.errors.append(obj)
        elif kind == "response.output_item.added":
            added.append(obj.get("output_index"))
        elif kind == "response.function_call_arguments.delta":
            deltas[obj.get("item_id")] = deltas.get(obj.get("item_id"), "") + obj.get("delta", "")
        elif kind == "response.output_item.done" and obj["item"].get("type") == "function_call":
            item = obj["item"]
            got.calls.append({"id": item.get("call_id"), "name": item.get("name"), "arguments": item.get("arguments")})
            if deltas.get(item.get("id"), "") != item.get("arguments"):
                got.problems.append("the deltas and the done item disagree")
        elif kind in ("response.completed", "response.incomplete"):
            got.finish = obj["response"].get("status")
            completed = [i for i in obj["response"].get("output") or [] if i.get("type") == "function_call"]
    if not _dense(added):
        got.problems.append(f"output_index {added}")
    if completed is not None:
        final = [{"id": i.get("call_id"), "name": i.get("name"), "arguments": i.get("arguments")} for i in completed]
        if final != got.calls:
            got.problems.append("response.completed disagrees with the streamed items")
    elif got.calls and not got.errors:
        got.problems.append("no response.completed")
    return got


def _messages(data: bytes) -> Received:
    got = Received()
    blocks: dict[Any, dict[str, Any]] = {}
    started: list[Any] = []
    for _, obj in _events(data):
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "error":
            got.errors.append(obj)
        elif kind == "content_block_start":
            started.append(obj.get("index"))
            block = obj["content_block"]
            if block.get("type") == "tool_use":
                blocks[obj.get("index")] = {
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "parts": [],
                    "input": block.get("input"),
                }
        elif kind == "content_block_delta" and obj["delta"].get("type") == "input_json_delta":
            if obj.get("index") in blocks:
                blocks[obj["index"]]["parts"].append(obj["delta"].get("partial_json", ""))
            else:
                got.problems.append("input_json_delta for no tool_use block")
        elif kind == "message_delta":
            got.finish = (obj.get("delta") or {}).get("stop_reason")
    for block in blocks.values():
        text = "".join(block["parts"]) if block["parts"] else json.dumps(block["input"] or {})
        got.calls.append({"id": block["id"], "name": block["name"], "arguments": text})
    if not _dense(started):
        got.problems.append(f"block indexes {started}")
    _finish_agrees(got, "tool_use")
    return got


def _finish_agrees(got: Received, calls_finish: str) -> None:
    """The finish (chat `finish_reason`, Messages `stop_reason`) says calls if and only if calls went out."""
    if got.calls and got.finish != calls_finish and not got.errors:
        got.problems.append(f"finish {got.finish!r} with calls")
    if not got.calls and got.finish == calls_finish:
        got.problems.append(f"a {calls_finish} finish with no call")


READERS = {"chat": _chat, "responses": _responses, "messages": _messages}


def judge(surface: Surface, expected: list[tuple[str, Any]], data: bytes) -> tuple[Outcome, str]:
    got = READERS[surface](data)
    if got.errors:
        return ("error", "") if not got.calls else ("wrong", f"{len(got.calls)} call(s) and an error")
    if got.problems:
        return "wrong", "; ".join(got.problems)
    if len(got.calls) != len(expected):
        return "wrong", f"{len(got.calls)} calls, expected {len(expected)}"
    ids = [c["id"] for c in got.calls]
    if not all(isinstance(i, str) and i for i in ids) or len(set(ids)) != len(ids):
        return "wrong", f"ids {ids}"
    for k, (call, (name, args)) in enumerate(zip(got.calls, expected, strict=True)):
        if call["name"] != name:
            return "wrong", f"call {k}: name {call['name']!r}, expected {name!r}"
        try:
            value = json.loads(call["arguments"])
        except (TypeError, ValueError):
            return "wrong", f"call {k}: arguments not JSON: {call['arguments']!r}"
        if not same_value(value, args):
            return "wrong", f"call {k}: arguments {call['arguments']!r}"
    return "exact", ""


@dataclass
class Example:
    surface: Surface
    source: str
    applied: list[str]
    preserves: bool
    outcome: Outcome
    reason: str
    sent: bytes
    received: bytes
    fragments: list[list[str]] = field(default_factory=list)  # each call's argument fragments as sent
    tools: list[dict[str, Any]] = field(default_factory=list)  # as the surface's request offers them
    expected: list[tuple[str, Any]] = field(default_factory=list)  # (name, arguments) the client must get
    leak: str = ""  # the format and field the calls leaked into ("glm47:reasoning"), when they did

    @property
    def acceptable(self) -> bool:
        return self.outcome == "exact" if self.preserves else self.outcome != "wrong"


def run_example(
    rng: random.Random, surface: Surface, turn: Turn, ids: list[str], apply: dict[str, Mutate] | None = None
) -> Example:
    """Mutate a valid turn with `ids` (those that apply), run the stage, judge the client's view
    (`apply`: mutations.compose's replacement functions)."""
    wire = compose(rng, new_wire(surface, turn, rng), ids, apply)
    sent = serialize(wire, rng)
    tools = surface_tools(turn, surface)
    received = run_stage(surface, tools, sent)
    expected = [(name, call.arguments) for name, call in zip(wire.expected_names, turn.calls, strict=True)]
    outcome, reason = judge(surface, expected, received)
    fragments = [list(c.frags or []) for c in wire.calls]
    kept = preserves(wire.applied)
    leak = leak_of(wire)
    where = f"{leak.fmt}:{leak.where}" if leak else ""
    return Example(
        surface, turn.source, wire.applied, kept, outcome, reason, sent, received, fragments, tools, expected, where
    )


@dataclass
class Decoy:
    """A decoy run: the markup where it is no call must reach the client byte for byte."""

    surface: Surface
    fmt: str
    kind: DecoyKind
    source: str
    sent: bytes
    received: bytes

    @property
    def unchanged(self) -> bool:
        return self.received == self.sent


def run_decoy(rng: random.Random, surface: Surface, turn: Turn, fmt: str, kind: DecoyKind) -> Decoy | None:
    """Format `fmt`'s markup of the turn's calls as a decoy of `kind`, through the stage (None: the
    format can't write it so)."""
    wire = decoy_wire(rng, new_wire(surface, turn, rng), fmt, kind)
    if wire is None:
        return None
    sent = serialize(wire, rng)
    received = run_stage(surface, surface_tools(turn, surface), sent)
    return Decoy(surface, fmt, kind, turn.source, sent, received)


def replay(example: dict[str, Any]) -> tuple[Outcome, str]:
    """Judge a dumped example (bench/repair_rates.py --dump) again against the current stage."""
    surface = example["surface"]
    received = run_stage(surface, example["tools"], example["sent"].encode())
    return judge(surface, [(n, a) for n, a in example["expected"]], received)


def applicable_example(
    rng: random.Random, surface: Surface, draw: Callable[[random.Random], Turn], ids: list[str], tries: int = 30
) -> Example | None:
    """The first of up to `tries` drawn turns that all of `ids` apply to (None: none did)."""
    for _ in range(tries):
        example = run_example(rng, surface, draw(rng), ids)
        if set(example.applied) == set(ids):
            return example
    return None
