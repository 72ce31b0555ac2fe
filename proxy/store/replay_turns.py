"""The turns reasoning replay looks up (request/reasoning_replay.py): recent ones in memory, older ones in
the store.

An agent's next turn often comes before the capture writer has stored the last one (it commits about
once a second; Claude Code's two turns came 0.7 s apart), so each answered turn of a model with
`replay_reasoning` is noted here as soon as its exchange ends, keyed by its `chain_hash` (its request's
conversation followed by the reply the client received: store/conversation.py). A turn not in memory (a
restart, another tapfix of a PostgreSQL fleet, one evicted) is read from the store by the same indexed
`chain_hash` column, which every backend keeps for sessions.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from tapfix.proxy.assemble import Assembled
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.request.billing_line import is_billing_line
from tapfix.proxy.request.reasoning_replay import AnsweredTurn, delivered_calls, session_key
from tapfix.proxy.store.conversation import (
    chat_parts,
    conversation_chain,
    reply_chains,
    reply_parts,
    responses_parts,
)
from tapfix.proxy.surfaces import Surface, api_surface, surface_for

log = logging.getLogger("tapfix")

MAX_TURNS = 4096
PER_CHAIN = 16  # one conversation answered this often (a script run again and again): the latest ones
MAX_BYTES = 64 * 1024 * 1024  # the reasoning held, at most
# Reads the store: the turns of the exchanges whose chain_hash is one of these, with that chain_hash.
StoreLookup = Callable[[Sequence[str]], Sequence[tuple[str, AnsweredTurn]]]


class RecentTurns:
    """`TurnSource` for the request policy. Noted from the event loop as exchanges end, read there too;
    the lock is for a store lookup a caller may run in a thread."""

    def __init__(self, lookup: StoreLookup | None = None, max_turns: int = MAX_TURNS, max_bytes: int = MAX_BYTES):
        self._turns: OrderedDict[str, list[AnsweredTurn]] = OrderedDict()
        self._bytes = 0
        self._max_turns, self._max_bytes = max_turns, max_bytes
        self._lock = threading.Lock()
        self.lookup = lookup
        self.replayed = 0  # turns whose reasoning went back into a request
        self.missed = 0  # turns resent without reasoning that matched none tapfix answered
        self._held = 0  # turns in memory

    def health(self) -> dict[str, int]:
        return {"replayed": self.replayed, "missed": self.missed, "held": self._held}

    def note(self, ex: Exchange, reply: Assembled) -> AnsweredTurn | None:
        """Remember the turn `ex` delivered (`reply`: the answer as the client received it), when it has
        reasoning and is a turn an agent continues (not a copy, an attempt, an error)."""
        if not reply.reasoning or ex.status is None or not 200 <= ex.status < 300:
            return None
        if ex.session_hint or {"replay", "probe"} & ex.tags or ex.attempt_of is not None:
            return None
        if not ex.store_bodies:  # metadata only (`store_bodies = false`, `--no-bodies`): no text is kept, here either
            return None
        surface = surface_for(ex.path)
        try:
            request = orjson.loads(ex.readable_request())
        except orjson.JSONDecodeError:
            return None
        shape = _shape(request, surface)
        if shape is None:
            return None
        preamble, items, parts_of = shape
        chain = conversation_chain(_without_billing(preamble), items, parts_of, reply_parts(reply))
        if chain is None:
            return None
        key = request.get("prompt_cache_key") if isinstance(request.get("prompt_cache_key"), str) else None
        turn = AnsweredTurn(
            ex.id,
            (ex.client_addr, ex.user_agent),
            session_key(ex.request_headers, {"prompt_cache_key": key}),
            len(items),
            reply.content,
            delivered_calls(reply.tool_calls),
            reply.reasoning,
        )
        self.add(chain, turn)
        return turn

    def add(self, chain: str, turn: AnsweredTurn) -> None:
        with self._lock:
            same = self._turns.setdefault(chain, [])
            same.append(turn)
            self._turns.move_to_end(chain)
            self._bytes += _size(turn)
            self._held += 1
            if len(same) > PER_CHAIN:
                self._bytes -= _size(same.pop(0))
                self._held -= 1
            while self._held > self._max_turns or self._bytes > self._max_bytes:
                oldest = next(iter(self._turns))
                turns = self._turns[oldest]
                self._bytes -= _size(turns.pop(0))
                self._held -= 1
                if not turns:
                    del self._turns[oldest]

    def candidates(
        self, parsed: Mapping[str, Any], surface: Surface, wanted: Sequence[int]
    ) -> Mapping[int, Sequence[AnsweredTurn]]:
        shape = _shape(parsed, surface)
        if shape is None or not wanted:
            return {}
        preamble, items, parts_of = shape
        whole = api_surface(surface).item_turns
        own = _without_billing(preamble)
        chains = {i: c for i, c in reply_chains(own, items, parts_of, whole).items() if i in wanted}
        # The store's chain_hash digests the preamble as the client sent it (sessions.py).
        stored = chains if own is preamble else reply_chains(preamble, items, parts_of, whole)
        found: dict[int, list[AnsweredTurn]] = {}
        unknown: dict[str, int] = {}
        with self._lock:
            for index, chain in chains.items():
                turns = self._turns.get(chain)
                if turns:
                    found[index] = list(turns)
                elif index in stored:
                    unknown[stored[index]] = index
        if unknown and self.lookup is not None:
            try:
                for chain, turn in self.lookup(list(unknown)):
                    found.setdefault(unknown[chain], []).append(turn)
            except Exception as e:  # noqa: BLE001  # a store out of reach: the turn is missed, the request goes on
                log.warning("reasoning replay: the store lookup failed: %s", e)
        return found

    def counted(self, replayed: int, missed: int) -> None:
        with self._lock:
            self.replayed += replayed
            self.missed += missed


def _shape(parsed: Any, surface: Surface | None) -> tuple[Any, list[Any], Any] | None:
    """A request's preamble, its conversation's items and how to read them; None: it holds none."""
    if not isinstance(parsed, dict):
        return None
    if api_surface(surface).item_turns:
        items, preamble, parts_of = parsed.get("input"), parsed.get("instructions"), responses_parts
    else:
        items, preamble, parts_of = parsed.get("messages"), parsed.get("system"), chat_parts
    return (preamble, items, parts_of) if isinstance(items, list) else None


def _without_billing(preamble: Any) -> Any:
    """Messages' `system` without Claude Code's billing block: versions that put `cch` in it change it on every
    request, so it would make each turn's digest differ from the last (request/billing_line.py). The same
    object when there is none."""
    if not isinstance(preamble, list) or not any(_billing(b) for b in preamble):
        return preamble
    return [b for b in preamble if not _billing(b)]


def _billing(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text" and is_billing_line(block.get("text"))


def _size(turn: AnsweredTurn) -> int:
    return len(turn.reasoning) + len(turn.content)


ANSWERED_SQL = (
    "select id, client_addr, user_agent, session_id, content, reasoning, tool_calls, chain_hash from exchanges"
    " where chain_hash in ({marks}) and reasoning is not null and reasoning <> '' limit 256"
)


def answered_turn(row: Sequence[Any]) -> AnsweredTurn | None:
    """A stored exchange as a turn, from `ANSWERED_SQL`'s columns; None: it holds no usable reasoning. A
    session tapfix named (`s-…`) is no session the agent named: the turn then matches only a request
    naming none, as in memory."""
    capture_id, addr, agent, session, content, reasoning, tool_calls = row[:7]
    if not reasoning:
        return None
    calls: Any = tool_calls
    if isinstance(tool_calls, str | bytes):
        try:
            calls = orjson.loads(tool_calls) if tool_calls else []
        except orjson.JSONDecodeError:
            return None
    return AnsweredTurn(
        str(capture_id),
        (addr or "", agent or ""),
        None if session is None or str(session).startswith("s-") else str(session),
        None,
        content or "",
        delivered_calls(calls if isinstance(calls, list) else []),
        str(reasoning),
    )


def store_lookup(reader: Callable[[], Any]) -> StoreLookup:
    """A `StoreLookup` over a capture store's reader (`StoreBackend.reader`), opened when first needed and
    kept; a failed read drops it, so the next lookup opens it again."""
    held: list[Any] = []

    def lookup(chains: Sequence[str]) -> list[tuple[str, AnsweredTurn]]:
        if not held:
            held.append(reader())
        try:
            rows = held[0].answered_turns(list(chains))
        except Exception:
            held.pop().close()
            raise
        out = []
        for row in rows:
            turn = answered_turn(row)
            if turn is not None:
                out.append((str(row[7]), turn))
        return out

    return lookup
