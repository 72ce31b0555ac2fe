"""Each turn's prefix break (proxy/request/prefix_break.py), worked out on the writer thread as it stores.

The writer sees a process's exchanges in the order they ended, so the previous request of a thread is
always behind the new one, even when the two come 0.7 s apart and neither is committed yet: the recent
requests of each session are kept here, in memory, as digests plus a reference to their body (parsed
again only when a break is found). The bound is on those bodies' bytes; the oldest session goes first. A
session not in memory (a restart; a fleet's other instance wrote its earlier turns) is read from the store
once, inside the writer's transaction (`STORED`).

The compared body is the one the engine received (the forwarded request when tapfix changed it, else the
client's), so a billing line tapfix removed, or reasoning it put back, is seen as the engine saw it; the
break's `body` says which, and its `offset` counts bytes in that body.

A request without a session id of its own whose earlier turns were not found (a chat client that edited
its system prompt: the conversation's digests no longer lead to the previous turn, so the store starts a
new session) is compared with the same client's recent requests too (its address and user-agent, for
clients that name no session), when it carries earlier turns.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tapfix.proxy.exchange import Exchange
from tapfix.proxy.http_headers import SESSION_HEADERS
from tapfix.proxy.jsonbody import NotedParse, json_object, noted_parse
from tapfix.proxy.request.prefix_break import Prompt, extends, find_break, previous_in_thread, prompt_of
from tapfix.proxy.store.redact import redact_content
from tapfix.proxy.store.unit_digests import UnitDigests
from tapfix.proxy.surfaces import Surface, api_surface, surface_for

# A session this writer hasn't seen yet (a restart, another instance of a fleet): its latest requests from the
# store, as the engine received them (`tapfix_body_bytes`: the forwarded body, else the request), newest first.
STORED = (
    "select id, ts, path, tapfix_body_bytes(id, 'forwarded') from exchanges"
    " where session_id = ? and id != ? and attempt_of is null order by ts desc limit ?"
)
Stored = Callable[[str, str, int], list[tuple[Any, ...]]]  # (session id, own id, limit) -> STORED's rows
log = logging.getLogger("tapfix.store")
STORED_LIMIT = 8  # the latest requests read back: the main agent's last turn and its subagents' most recent
PER_SESSION = 16  # recent requests kept per session (its threads: main agent, subagents, side requests)
MAX_BYTES = 64 * 1024 * 1024  # bodies kept in all, across sessions


@dataclass(frozen=True, slots=True)
class _Recent:
    capture_id: str
    started_at: float
    prompt: Prompt  # light
    body: bytes
    surface: Surface


class PrefixTracker:
    """Lives in the writer thread. `observe` returns the exchange's break as stored (None: none)."""

    def __init__(self, max_bytes: int = MAX_BYTES, per_session: int = PER_SESSION) -> None:
        self.max_bytes = max_bytes
        self.per_session = per_session
        self._recent: OrderedDict[str, deque[_Recent]] = OrderedDict()
        self._bytes = 0
        self.digests = UnitDigests()  # a thread's units come again every turn: digested once

    def observe(
        self,
        ex: Exchange,
        session_id: str | None,
        *,
        own_session: bool,
        stored: Stored | None = None,
        noted: NotedParse | None = None,
    ) -> dict[str, Any] | None:
        """`own_session`: the session started with this exchange (no explicit id, no earlier turn found);
        `stored`: reads a session's latest requests from the store (STORED), for a session not in memory;
        `noted`: the request side's parse of the body as forwarded (jsonbody.STORE_PARSE_KEY), read instead of
        parsing the body again when it is the body compared. Never raises for what a client sent: a body it
        can't read has no break, and its capture is stored."""
        try:
            return self._observe(ex, session_id, own_session, stored, noted)
        except (ValueError, TypeError, KeyError, IndexError, RecursionError) as e:
            log.warning("prefix break of %s not worked out: %s: %s", ex.id, type(e).__name__, e)
            return None

    def _observe(
        self, ex: Exchange, session_id: str | None, own_session: bool, stored: Stored | None, noted: NotedParse | None
    ) -> dict[str, Any] | None:
        surface = surface_for(ex.path)
        if session_id is None or surface is None or not api_surface(surface).turns or not _own(ex):
            return None
        which, body = ("forwarded", ex.forwarded) if ex.forwarded is not None else ("request", ex.readable_request())
        parsed = noted_parse(noted, body) or json_object(body)
        if parsed is None and which == "forwarded":
            which, body = "request", ex.readable_request()
            parsed = noted_parse(noted, body) or json_object(body)
        prompt = prompt_of(parsed, surface, self.digests) if parsed is not None else None
        if parsed is None or prompt is None:
            return None
        # Only what came before it: a batch written again after a failed transaction meets its own exchanges.
        when = (ex.started_at, ex.id)

        def earlier(r: _Recent) -> bool:
            return r.surface == surface and (r.started_at, r.capture_id) < when

        if stored is not None and not own_session and session_id not in self._recent:
            self._load(session_id, ex.id, stored)  # once per session: its bodies are decoded
        candidates = [r for r in self._recent.get(session_id, ()) if earlier(r)]
        client = None if _named(ex, parsed) else _client_key(ex)
        if client is not None and own_session and prompt.conversation > 1:
            seen = {r.capture_id for r in candidates}
            candidates += [r for r in self._recent.get(client, ()) if earlier(r) and r.capture_id not in seen]
        found = previous_in_thread(prompt, [(r.capture_id, r.prompt) for r in candidates])
        result = None
        if found is not None and not extends(found[1], prompt):
            previous = next(r for r in candidates if r.capture_id == found[0])
            result = self._compare(previous, prompt, body, which)
            if result is not None and not ex.store_bodies:  # privacy: no text of the prompt, not even excerpts
                del result["old"], result["new"]
        kept = _Recent(ex.id, ex.started_at, prompt.light(), body, surface)
        self._keep(session_id, kept)
        if client is not None:
            self._keep(client, kept)
        return result

    def _load(self, session_id: str, own_id: str, stored: Stored) -> None:
        for capture_id, ts, path, body in reversed(stored(session_id, own_id, STORED_LIMIT)):
            surface = surface_for(path or "")
            parsed = json_object(bytes(body)) if body is not None and surface is not None else None
            prompt = prompt_of(parsed, surface, self.digests) if parsed is not None else None
            if prompt is not None and surface is not None:
                self._keep(session_id, _Recent(str(capture_id), float(ts), prompt.light(), bytes(body), surface))

    def _compare(self, previous: _Recent, prompt: Prompt, body: bytes, which: str) -> dict[str, Any] | None:
        parsed = json_object(previous.body)
        whole = prompt_of(parsed, previous.surface, self.digests) if parsed is not None else None
        if whole is None:
            return None
        found = find_break(whole, prompt, body)
        if found is None:
            return None
        return found.as_dict(previous.capture_id, redact_content) | {"body": which}

    def _keep(self, key: str, recent: _Recent) -> None:
        queue = self._recent.pop(key, None) or deque()
        for again in [r for r in queue if r.capture_id == recent.capture_id]:  # written again after a rollback
            queue.remove(again)
            self._bytes -= len(again.body)
        queue.append(recent)
        self._bytes += len(recent.body)
        while len(queue) > self.per_session:
            self._bytes -= len(queue.popleft().body)
        self._recent[key] = queue  # the most recently used last
        while self._bytes > self.max_bytes and self._recent:
            _, oldest = next(iter(self._recent.items()))
            self._bytes -= len(oldest.popleft().body)
            if not oldest:
                self._recent.popitem(last=False)


def _own(ex: Exchange) -> bool:
    """A turn of an agent: not a replay or a probe (copies), not a regeneration attempt."""
    return ex.attempt_of is None and not ex.session_hint and not ({"replay", "probe"} & ex.tags)


def _named(ex: Exchange, parsed: dict[str, Any]) -> bool:
    """The client named its session (a header, `prompt_cache_key`, a replay's own): no need to follow it."""
    named = {name.lower() for name, value in ex.request_headers if value}
    return bool(ex.session_hint or named & set(SESSION_HEADERS) or parsed.get("prompt_cache_key"))


def _client_key(ex: Exchange) -> str:
    return f"\0client\0{ex.client_addr}\0{ex.user_agent}"
