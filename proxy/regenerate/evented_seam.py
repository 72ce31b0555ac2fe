"""Where a later attempt joins a streamed Responses or Messages answer (issue 19), so the client reads one.

The client already holds the first attempt's opening (`response.created` / `message_start`), the items
or content blocks that went out before the broken call was held, and numbers: Responses events carry a
running `sequence_number` and an `output_index`, Messages blocks an `index`. A new attempt starts all
of them again from 0 and names itself anew, so its events are rewritten to continue what the client saw:

- its opening events are dropped (the client has one `response.created`, one `message_start`);
- its items (blocks) are numbered after the ones the client has, `sequence_number` carries on from the
  client's last one, and the terminal object (`response.completed` / `.incomplete` / `.failed`) keeps
  the first attempt's response id and lists the client's earlier items before the new ones;
- text the client already received is not repeated: a `message` or `reasoning` item (a `text` or
  `thinking` block) of the new attempt is dropped when the client already has one of that type; the
  new attempt's tool calls, and text of a type the client has none of, go out. A kept item whose id the
  client already has (an engine that derives ids from the request, like the mock) gets a suffix.

The seam runs after the attempt's own tool-call stage, which sees the attempt as a stream of its own
(indexes dense from 0), and its error events, if the attempt breaks too, go through `remap`. The first
attempt's view is read once per attempt end from the client-bound bytes, never per chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from tapfix.proxy.changes import Change
from tapfix.proxy.regenerate.continuation import STAGE, Received
from tapfix.proxy.sse import SSESplitter, named_event
from tapfix.proxy.surfaces import Surface, api_surface
from tapfix.proxy.toolcalls.evented_stage import as_dict, event_name, parse

_OPENING: Final = frozenset({"response.created", "response.in_progress", "message_start"})
_TERMINAL: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Items (blocks) that carry text; a new attempt's one is dropped when the client already has its type.
_TEXT_KINDS: Final = frozenset({"message", "reasoning", "text", "thinking", "redacted_thinking"})
_CALL_KINDS: Final = frozenset({"function_call", "custom_tool_call", "tool_use", "server_tool_use"})
# Where an attempt that never called a tool has answered: its held text goes out before these.
_FINISHES: Final = frozenset({"response.completed", "response.incomplete", "message_delta"})


@dataclass
class ClientView:
    """What the client has of an evented answer: its text, the items (blocks) in order, the numbers."""

    surface: Surface
    received: Received
    response_id: str | None = None  # Responses: the id of the client's `response.created`
    last_seq: int = -1  # Responses: the last sequence_number the client got
    items: list[dict[str, Any]] = field(default_factory=list)  # in output order (the `.done` form once it came)
    kinds: set[str] = field(default_factory=set)

    @property
    def item_ids(self) -> set[str]:
        return {i["id"] for i in self.items if isinstance(i.get("id"), str)}

    def seam(self, attempt: int, changes: list[Change] | None = None) -> EventedSeam:
        return EventedSeam(self, attempt, changes)


def _objects(client_chunks: Sequence[bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    splitter = SSESplitter()
    for event in splitter.feed(b"".join(client_chunks)) + splitter.flush():
        obj = parse(event)
        if obj is not None:
            yield str(obj.get("type") or event_name(event) or ""), obj


def client_view(surface: Surface, client_chunks: Sequence[bytes]) -> ClientView:
    """The client's view of a Responses or Messages answer so far, from the client-bound bytes."""
    content: list[str] = []
    reasoning: list[str] = []
    call_sent = False
    view = ClientView(surface, Received())
    api = api_surface(surface)
    by_position: dict[int, dict[str, Any]] = {}
    for kind, obj in _objects(client_chunks):
        seq = obj.get("sequence_number")
        if isinstance(seq, int) and not isinstance(seq, bool):
            view.last_seq = max(view.last_seq, seq)
        if kind == "response.created" and view.response_id is None:
            view.response_id = as_dict(obj.get("response")).get("id")
        elif kind in ("response.output_item.added", "response.output_item.done", "content_block_start"):
            item = as_dict(obj.get(api.item_field or ""))
            position = obj.get(api.index_field or "")
            if isinstance(position, int) and item:
                by_position[position] = item
                view.kinds.add(str(item.get("type")))
                call_sent = call_sent or item.get("type") in _CALL_KINDS
        elif kind == "response.output_text.delta" and isinstance(obj.get("delta"), str):
            content.append(obj["delta"])
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            reasoning.append(str(obj.get("delta") or ""))
        elif kind == "response.function_call_arguments.delta":
            call_sent = True
        elif kind == "content_block_delta":
            delta = as_dict(obj.get("delta"))
            if delta.get("type") == "text_delta":
                content.append(str(delta.get("text") or ""))
            elif delta.get("type") == "thinking_delta":
                reasoning.append(str(delta.get("thinking") or ""))
            elif delta.get("type") == "input_json_delta":
                call_sent = True
    view.items = [by_position[k] for k in sorted(by_position)]
    view.received = Received("".join(content), "".join(reasoning), call_sent)
    return view


class EventedSeam:
    """The last stage of a Responses or Messages attempt 2+: its events rewritten to continue the client's.

    A text item (block) of a type the client has is held until the attempt calls a tool (then it is a
    repeat: dropped, a `drop` row in `changes`) or finishes without one (then it is the answer: it goes
    out, numbered after the client's items, before the terminal event)."""

    def __init__(self, view: ClientView, attempt: int, changes: list[Change] | None = None) -> None:
        self.view = view
        self.attempt = attempt
        self.changes = changes if changes is not None else []
        self.held: dict[int, list[bytes]] = {}  # text items of a type the client has, by the attempt's index
        self.held_ids: dict[int, str] = {}
        self.calling = False  # the attempt opened a tool call: held text is a repeat
        api = api_surface(view.surface)
        self.numbered = api.numbered  # its events carry `sequence_number`, renumbered after the client's
        self.index_key, self.item_key = api.index_field or "", api.item_field or ""
        self.seq = view.last_seq
        self.base = len(view.items)
        self.positions: dict[int, int] = {}  # the attempt's output index -> the client's
        self.dropped: set[int] = set()
        self.dropped_ids: set[str] = set()
        self.renamed: dict[str, str] = {}
        self.seen = False  # an event of this attempt reached the seam

    def feed(self, event: bytes) -> list[bytes]:
        obj = parse(event)
        if obj is None:
            return [event]  # a comment (keep-alive, holding note) or bytes that aren't an event
        self.seen = True
        kind = str(obj.get("type") or event_name(event) or "")
        if kind in _OPENING:
            return []
        key = self.index_key
        index = obj.get(key)
        if kind in _FINISHES and self.held:
            return [*self._release(), *self.feed(event)]  # it answered without a call: its text goes out
        if not isinstance(index, int) or isinstance(index, bool):
            if not self.numbered:
                return [event]  # message_delta, message_stop, ping, error: nothing to renumber
            index = None
        if index is not None and index in self.held:
            self.held[index].append(event)
            return []
        if index is not None and index not in self.positions and index not in self.dropped:
            if not self._place(index, kind, obj, event):
                return []
        if index is not None and index in self.dropped:
            return []
        out = dict(obj)
        if index is not None:
            out[key] = self.positions.get(index, index + self.base)
        if self.numbered:
            self._renumber(out)
        nl = b"\r\n" if b"\r\n" in event else b"\n"
        return [named_event(kind, out, nl)]

    def _place(self, index: int, kind: str, obj: dict[str, Any], event: bytes) -> bool:
        """Give a new item (block) its place after the client's, or drop it (text the client has). False: dropped."""
        opening = kind in ("response.output_item.added", "content_block_start")
        item = as_dict(obj.get(self.item_key)) if opening else {}
        item_type = item.get("type")
        item_id = item.get("id")
        if item_type in _CALL_KINDS and not self.calling:
            self.calling = True
            for held in list(self.held):
                self._drop(held, self.held_ids.get(held))
            self.held = {}
        if item_type in _TEXT_KINDS and item_type in self.view.kinds:
            if self.calling:
                self._drop(index, item_id if isinstance(item_id, str) else None)
                return False
            self.held[index] = [event]
            if isinstance(item_id, str):
                self.held_ids[index] = item_id
            return False
        self.positions[index] = self.base + len(self.positions)
        if isinstance(item_id, str) and item_id in self.view.item_ids:
            self.renamed[item_id] = f"{item_id}_{self.attempt}"
        return True

    def _drop(self, index: int, item_id: str | None) -> None:
        self.dropped.add(index)
        if item_id is not None:
            self.dropped_ids.add(item_id)
        if not any(c.path == f"attempt[{self.attempt}].text" for c in self.changes):
            reason = f"attempt {self.attempt} starts from scratch: text of a kind the client has is not repeated"
            self.changes.append(Change(STAGE, "drop", f"attempt[{self.attempt}].text", None, None, reason))

    def _release(self) -> list[bytes]:
        """The held text items, placed after the client's (and the attempt's earlier ones), in order."""
        held, self.held = self.held, {}
        out: list[bytes] = []
        for index, events in sorted(held.items()):
            self.positions[index] = self.base + len(self.positions)
            item_id = self.held_ids.get(index)
            if item_id is not None and item_id in self.view.item_ids:
                self.renamed[item_id] = f"{item_id}_{self.attempt}"
            for event in events:
                out += self.feed(event)
        return out

    def _renumber(self, out: dict[str, Any]) -> None:
        """A Responses event's sequence_number, item ids and terminal object, continuing the client's."""
        if "sequence_number" in out:
            self.seq += 1
            out["sequence_number"] = self.seq
        if isinstance(out.get("item_id"), str) and out["item_id"] in self.renamed:
            out["item_id"] = self.renamed[out["item_id"]]
        item = out.get("item")
        if isinstance(item, dict) and item.get("id") in self.renamed:
            out["item"] = {**item, "id": self.renamed[item["id"]]}
        response = out.get("response")
        if out.get("type") in _TERMINAL and isinstance(response, dict):
            patched = dict(response)
            if self.view.response_id is not None:
                patched["id"] = self.view.response_id
            if isinstance(response.get("output"), list):
                patched["output"] = [*self.view.items, *self._own(response["output"])]
            out["response"] = patched

    def _own(self, output: list[Any]) -> list[Any]:
        kept = []
        for item in output:
            if isinstance(item, dict):
                if item.get("id") in self.dropped_ids:
                    continue
                if item.get("id") in self.renamed:
                    item = {**item, "id": self.renamed[item["id"]]}
            kept.append(item)
        return kept

    def flush(self) -> list[bytes]:
        """The attempt ended with neither a call nor a finish: held text is no answer."""
        for index in list(self.held):
            self._drop(index, self.held_ids.get(index))
        self.held = {}
        return []

    def remap(self, events: list[bytes]) -> list[bytes]:
        """The attempt's deferred error events, numbered like the rest of it."""
        out: list[bytes] = []
        for event in events:
            out += self.feed(event)
        return out
