"""llama.cpp slot pinning (issue 38): each conversation thread's turns go to one slot of a llama-server run with
`-np N` (`[upstreams.X] slots = N`), so the slot's KV cache still holds the thread's prompt when its next turn
comes. llama-server picks a slot by prompt similarity, else the least recently used one: a subagent fan-out or a
second client takes the main agent's slot while it waits for them, and its next turn prefills the whole prompt
again. `id_slot` in the request body names the slot instead.

Where llama-server reads `id_slot` (its `tools/server` source, the build tapfix tests against): chat completions
and legacy completions pass unknown body fields through to the task's parameters, and so does `/v1/responses`
(the body is copied into the chat request it is converted to); `/v1/messages` builds a new chat request from a
list of known fields, so `id_slot` never reaches the task (llama.cpp PR #26758): Messages requests are not
pinned. `slot_id`, a spelling some clients send, is read nowhere: it is flagged, never acted on.

The thread key is the router's (request/routes.py `thread_of`: the session header and the first two messages).
Which thread is a session's main agent (for `reserve_main_slot`), from what real clients send:

- opencode runs a subagent in a child session and says so: `x-parent-session-id` names the parent (the main
  agent's session); such a request is a subagent's.
- Claude Code sends one `X-Claude-Code-Session-Id` for its main agent and every subagent. A subagent is started
  by a tool call of the main agent, so the main agent's first request comes first: the first thread of a session
  that offers tools is its main thread; a request without tools (a title, a summary) is a side request and
  never the main one.
- A request that names no session (omp and pi on chat completions) can't be told apart: it keeps no slot for
  anyone and shares the slots that aren't a main agent's.

Pure: the router addon (addons/router.py) keeps a `SlotPlanner` for the proxy's life and asks it per request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tapfix.proxy.changes import Change
from tapfix.proxy.http_headers import SESSION_HEADERS
from tapfix.proxy.request.routes import thread_of
from tapfix.proxy.request.routing import Problem
from tapfix.proxy.surfaces import CHAT, COMPLETIONS, RESPONSES, PerSurface, Surface, api_surface
from tapfix.proxy.window.clamp import chat_messages

# The surfaces whose requests llama.cpp reads `id_slot` from (its /v1/messages builds a request of its own
# from a fixed list of fields and drops it): a part of each surface this layer owns, keyed by the objects.
PINNED_SURFACES: PerSurface[bool] = PerSurface({CHAT: True, COMPLETIONS: True, RESPONSES: True})
SLOT_FIELD = "id_slot"
MISSPELT_FIELD = "slot_id"  # llama.cpp reads no such field
PARENT_SESSION_HEADER = "x-parent-session-id"  # opencode's child session (a subagent): its parent session
SESSIONS_KEPT = 10_000  # sessions whose main thread is remembered (the oldest forgotten first)
Role = Literal["main", "subagent", "unnamed"]


@dataclass(slots=True)
class _Slot:
    thread: str | None = None
    main: bool = False  # held by a session's main agent thread (reserve_main_slot)
    used: float = float("-inf")  # when a request last went to it or came back from it
    busy: int = 0  # requests on it now


@dataclass(frozen=True, slots=True)
class Pin:
    slot: int
    how: Literal["kept", "free", "evicted"]  # the thread's own slot, a free one, or one taken from `evicted`
    evicted: str | None = None


class SlotPins:
    """The slots of one llama-server: which thread holds which. A thread keeps its slot across turns until another
    thread takes it; a new thread gets a free slot, else the least recently used one, one with no request on it
    before one with (a pinned request waits in llama-server for its slot). With `reserve_main`, threads of
    sessions' main agents hold at most all slots but one; other threads never take theirs, and a main thread
    takes another's only when mains hold all but one."""

    def __init__(self, slots: int, reserve_main: bool = False) -> None:
        if slots < 1:
            raise ValueError(f"slots must be 1 or more, got {slots}")
        self.slots = [_Slot() for _ in range(slots)]
        self.reserve_main = reserve_main and slots >= 2
        self.pins: dict[str, int] = {}  # thread → its slot

    def pin(self, thread: str, main: bool, now: float) -> Pin:
        """The slot `thread`'s request goes to; counted busy until `release`."""
        held = self.pins.get(thread)
        if held is not None:
            how: Literal["kept", "free", "evicted"] = "kept"
            index, evicted = held, None
        else:
            candidates = self._candidates(main)
            free = [i for i in candidates if self.slots[i].thread is None]
            if free:
                index, how, evicted = free[0], "free", None
            else:
                index = min(candidates, key=lambda i: (self.slots[i].busy > 0, self.slots[i].used, i))
                how, evicted = "evicted", self.slots[index].thread
                self.pins.pop(evicted or "", None)
            self.pins[thread] = index
        slot = self.slots[index]
        slot.thread, slot.used = thread, now
        slot.main = main and self.reserve_main if held is None else slot.main
        slot.busy += 1
        return Pin(index, how, evicted)

    def rename(self, old: str, new: str) -> None:
        """`old`'s slot is `new`'s now (a conversation that started again goes on where it was)."""
        if old in self.pins and new not in self.pins:
            index = self.pins[new] = self.pins.pop(old)
            self.slots[index].thread = new

    def release(self, index: int, now: float) -> None:
        """A request pinned to `index` ended (answered, failed or cut)."""
        if 0 <= index < len(self.slots):
            slot = self.slots[index]
            slot.busy = max(0, slot.busy - 1)
            slot.used = max(slot.used, now)

    def _candidates(self, main: bool) -> list[int]:
        everyone = range(len(self.slots))
        if not self.reserve_main:
            return list(everyone)
        mains = [i for i in everyone if self.slots[i].main]
        others = [i for i in everyone if not self.slots[i].main]
        if main and len(mains) >= len(self.slots) - 1:
            return mains  # mains hold all but one: a new main takes the least recently used main's
        return others or list(everyone)


@dataclass(frozen=True, slots=True)
class SlotRequest:
    """What pinning reads from one request."""

    thread: str | None  # the conversation (request/routes.py `thread_of`); None: nothing to key a pin by
    session: str | None  # the session the agent names (its parent's, for opencode's child sessions)
    subagent: bool  # the client says it is a subagent (`x-parent-session-id`)
    offers_tools: bool
    head: str | None = None  # its conversation's first message (the system prompt) and its tools, hashed
    client_slot: Any = None  # the client's own `id_slot`, if it sent one
    misspelt: bool = False  # it sent `slot_id`, which llama.cpp ignores


def slot_request(
    surface: Surface | None, parsed: Mapping[str, Any], headers: Mapping[str, str], thread: str | None = None
) -> SlotRequest:
    """`thread`: the router's key for the conversation when it made one already (a model with routes). A legacy
    completion has no messages to key one by: its thread is the session the client names, if any."""
    lowered = {k.lower(): v for k, v in headers.items() if v}
    parent = lowered.get(PARENT_SESSION_HEADER)
    session = parent or next((lowered[h] for h in SESSION_HEADERS if h in lowered), None)
    messages = chat_messages(surface, dict(parsed))
    if thread is None and messages:
        thread = thread_of(messages, lowered)
    elif thread is None and surface is not None and api_surface(surface).prompt_only and session is not None:
        thread = thread_of([{"session": session}], lowered)
    tools = parsed.get("tools")
    return SlotRequest(
        thread=thread,
        session=session[:200] if session else None,
        subagent=parent is not None,
        offers_tools=isinstance(tools, list) and bool(tools),
        head=thread_of([*messages[:1], tools], {}) if messages else None,
        client_slot=parsed.get(SLOT_FIELD),
        misspelt=MISSPELT_FIELD in parsed,
    )


@dataclass(slots=True)
class SlotPlanner:
    """Every slotted upstream's pins, and each session's main thread (the last `SESSIONS_KEPT` sessions)."""

    upstreams: dict[str, SlotPins] = field(default_factory=dict)
    # session → its main thread and that thread's first message (hashed), newest last
    mains: OrderedDict[str, tuple[str, str | None]] = field(default_factory=OrderedDict)

    def role(self, request: SlotRequest) -> tuple[Role, str | None]:
        """main: the first thread of its session that offers tools; subagent: any other thread of a named
        session; unnamed: no session named, nothing to tell it by. A new thread of the session that starts with the
        main thread's own first message (its system prompt) and offers its tools is the main agent's conversation
        started again (compacted; a subagent has a prompt and tools of its own): it is the main thread now, and
        the thread it continues is returned too."""
        if request.session is None or request.thread is None:
            return "unnamed", None
        if request.subagent:
            return "subagent", None
        main = self.mains.get(request.session)
        continues = None
        if request.offers_tools and (main is None or (main[0] != request.thread and main[1] == request.head)):
            continues = main[0] if main is not None else None
            self.mains[request.session] = main = (request.thread, request.head)
            while len(self.mains) > SESSIONS_KEPT:
                self.mains.popitem(last=False)
        if main is not None:
            self.mains.move_to_end(request.session)
        return ("main" if main is not None and main[0] == request.thread else "subagent"), continues

    def pins_of(self, upstream: str, slots: int, reserve_main: bool) -> SlotPins:
        pins = self.upstreams.get(upstream)
        if pins is None or len(pins.slots) != slots or pins.reserve_main != (reserve_main and slots >= 2):
            pins = self.upstreams[upstream] = SlotPins(slots, reserve_main)
        return pins

    def plan(
        self, upstream: str, slots: int, reserve_main: bool, surface: Surface | None, request: SlotRequest, now: float
    ) -> SlotPlan | None:
        """The slot this request goes to on `upstream`, and why; None when it isn't pinned (a surface llama.cpp
        doesn't pin, no thread to key it by, or the client chose its own slot)."""
        if surface is None or not PINNED_SURFACES.get(surface) or request.thread is None:
            return None
        if request.client_slot is not None:
            return SlotPlan(upstream, None, request.thread, None, "client", None, request.client_slot)
        role, continues = self.role(request)
        if continues is not None:  # the main agent's slot (its system prompt and tools are cached there) goes on
            for held in self.upstreams.values():
                held.rename(continues, request.thread)
        pins = self.pins_of(upstream, slots, reserve_main)
        pin = pins.pin(request.thread, role == "main", now)
        return SlotPlan(upstream, pin.slot, request.thread, role, pin.how, pin.evicted, None, continues)

    def release(self, upstream: str, slot: int, now: float) -> None:
        pins = self.upstreams.get(upstream)
        if pins is not None:
            pins.release(slot, now)


@dataclass(frozen=True, slots=True)
class SlotPlan:
    upstream: str
    slot: int | None  # None: the client's own `id_slot` stands
    thread: str
    role: Role | None
    how: str  # kept | free | evicted | client
    evicted: str | None
    client_slot: Any
    continues: str | None = None  # the main thread this one started again (compacted), whose slot it kept

    def record(self) -> dict[str, Any]:
        """The capture's `route_decision.slot` (before the answer's `cache_n` is added)."""
        found: dict[str, Any] = {"upstream": self.upstream, "slot": self.slot, "thread": self.thread}
        if self.how == "client":
            found.update(how="client", client_slot=self.client_slot)
            return found
        found.update(role=self.role, how=self.how)
        if self.evicted is not None:
            found["evicted"] = self.evicted
        if self.continues is not None:
            found["continues"] = self.continues
        return found

    def change(self) -> Change | None:
        if self.slot is None:
            return None
        why = {
            "kept": "the slot this thread's previous turn used",
            "free": "a free slot",
            "evicted": "the least recently used slot (its thread loses its pin)",
        }[self.how]
        return Change("router", "set", "$.id_slot", None, self.slot, f"llama.cpp slot on {self.upstream}: {why}")


def with_slot(body: bytes, slot: int) -> bytes | None:
    """`body` (a JSON object without `id_slot`) with `"id_slot": slot` as its last member, written in before the
    closing brace; nothing else is read (a splice walks the whole body: ~2 ms for an 80 KB agent request). None
    when the bytes aren't an object's (a body forwarded compressed)."""
    end = len(body.rstrip())
    if not body.lstrip().startswith(b"{") or body[end - 1 : end] != b"}":
        return None
    head = body[: end - 1]
    last = len(head.rstrip())
    comma = b"" if head[last - 1 : last] == b"{" else b","
    return head[:last] + comma + b'"%s":%d' % (SLOT_FIELD.encode(), slot) + body[last:]


def slot_count_problem(upstream: str, configured: int, props: Any) -> Problem | None:
    """`slots` against the slots llama-server says it runs (`GET /props`, `total_slots`). More configured than it
    runs: llama-server takes `id_slot` modulo its slot count, so two pinned threads share a slot and evict each
    other's cache on every turn: an error. Fewer: the slots past them are never pinned to: a warning."""
    running = props.get("total_slots") if isinstance(props, dict) else None
    if not isinstance(running, int) or isinstance(running, bool) or running == configured:
        return None
    where = f"upstreams.{upstream}.slots"
    if configured > running:
        said = f"slots = {configured}, but llama-server runs {running} (-np {running}): pinned threads share slots"
        return Problem("error", where, said)
    return Problem("warning", where, f"slots = {configured}, but llama-server runs {running}: the rest go unused")


def misspelt_change() -> Change:
    return Change(
        "router",
        "warning",
        "$.slot_id",
        None,
        None,
        "llama.cpp reads id_slot, not slot_id: the client's slot_id is ignored upstream (forwarded as sent)",
    )
