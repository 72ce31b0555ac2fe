"""Group exchanges into agent sessions: one session is one agent run, shown and replayed turn by turn.

In order:
1. an id the agent sends: opencode's `x-session-id` header, Claude Code's `X-Claude-Code-Session-Id`
   (on every request it sends, its subagents' too), a replay's own session, the Responses API's
   `prompt_cache_key`; `previous_response_id` joins the session of the exchange that returned that
   response;
2. a first turn (no assistant message in its conversation) starts a new session;
3. a later turn joins the session of the exchange it continues: the one whose conversation plus the
   reply the client received is the longest prefix of this request's conversation (see
   `conversation`). When several match (twenty runs of one script), the same client address and
   user-agent come first, then a session whose latest turn is that exchange (not yet continued):
   twenty identical runs stay twenty. The connection is no criterion: clients reconnect between turns.

Everything is read from the store inside the writer's transaction, never from a process's memory, so
several `tapfix run` writing one database agree. Their writers are not ordered, though: a turn may be
written before the turn it continues (another process's writer is a batch behind). Such a turn starts
a session that `wants` its parent, and the parent, once written, takes that session in.

**Threads.** A session may hold several chains of requests that extend each other: Claude Code's main
agent, each subagent it starts and its side requests (a title, a summary) all send one session id. A
thread is named by the id of its first exchange (`thread_id`): an exchange that continues another (the
longest prefix, looked up in its own session when the agent named the session) joins that exchange's
thread, one that continues none starts its own. What needs one conversation chain (prefix comparisons,
upstream affinity) works on threads. A turn written before the turn it continues starts a thread of its
own (its session is still taken in as above). Copies (replays, probes) and regeneration attempts have
no thread: nothing continues them.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from tapfix.proxy.assemble import Assembled
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.http_headers import SESSION_HEADERS
from tapfix.proxy.jsonbody import NotedParse, noted_parse
from tapfix.proxy.jsonsplice import SpliceError, top_level_item_spans
from tapfix.proxy.sse import event_data
from tapfix.proxy.store.conversation import CONVERSATION_FIELDS, Items, Parser, Spans, reply_parts
from tapfix.proxy.surfaces import api_surface, surface_for

if TYPE_CHECKING:
    from tapfix.proxy.store.sql_executor import Executes

_ID_MAX = 200
_RESPONSE_PREFIX = "resp:"  # a `wants` naming a Responses response id rather than a chain hash


@dataclass(frozen=True, slots=True)
class SessionSQL:
    """The statements sessions need, in a backend's dialect (qmark parameters on every backend).
    `continued` and `continued_in` take `{values}`: one `(?, ?)` per parent hash. The lookups return the
    thread of the exchange found too (its `thread_id`, else its own id: a row written before threads)."""

    by_response: str
    continued: str
    continued_in: str  # the same lookup, in one session (the agent named it): the thread only
    record: str
    orphan: str
    adopt: str
    # One statement that takes in the waiting session, if any, reading nothing back (params: the
    # wanted hash, the session's id, its user-agent, the session's id twice more): a backend that
    # pipelines its batch (PostgreSQL) then has no round trip per exchange for it. None: `orphan`,
    # then `adopt` and the rest.
    adopt_waiting: str | None = None
    # Whether any session waits for a parent at all (its `wants`): asked once a transaction, so the turns of a
    # batch don't each ask `orphan` for nothing (a statement each, issue 34). None: `orphan` every time.
    any_waiting: str | None = None


@dataclass(frozen=True, slots=True)
class SessionLink:
    """Where one exchange belongs, and what a later turn will find it by."""

    session_id: str | None
    chain_hash: str | None = None  # its conversation followed by its reply (None: nothing to continue)
    response_id: str | None = None  # a Responses response id, for `previous_response_id`
    wants: str | None = None  # the parent a session's first turn could not find yet
    thread_id: str | None = None  # the first exchange of its chain of requests (None: a copy, an attempt)


def _spans(body: bytes, arrays: tuple[str, ...] = (), parsed: dict[str, Any] | None = None) -> tuple[Spans, Items]:
    """The top-level members, and the items of the conversation arrays, in one pass over the body (`parsed`: its
    parse, when the request side's is at hand)."""
    if body[:1] != b"{" and not body.lstrip()[:1] == b"{":
        return {}, {}
    try:
        return top_level_item_spans(body, arrays, parsed)
    except (SpliceError, IndexError):
        return {}, {}


def _string(body: bytes, spans: Spans, key: str) -> str | None:
    where = spans.get(key)
    if where is None or body[where[0]] != 0x22:
        return None
    try:
        value = orjson.loads(body[slice(*where)])
    except orjson.JSONDecodeError:
        return None
    return value[:_ID_MAX] if isinstance(value, str) and value else None


def explicit_key(ex: Exchange, spans: Spans) -> str | None:
    named = {name.lower(): value for name, value in ex.request_headers if value}
    for header in SESSION_HEADERS:
        if header in named:
            return named[header][:_ID_MAX]
    if ex.session_hint:
        return ex.session_hint
    return _string(ex.readable_request(), spans, "prompt_cache_key")


def response_id(client: bytes) -> str | None:
    """The Responses response id the client received: the body's `id`, or the first event's `response.id`."""
    head = client.lstrip()[:1]
    if head == b"{":
        return _string(client, _spans(client)[0], "id")
    for line in client[: 1 << 20].split(b"\n", 64)[:64]:
        data = event_data(line) if line.startswith(b"data:") else None
        if data is None:
            continue
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        response = event.get("response") if isinstance(event, dict) else None
        if isinstance(response, dict) and isinstance(response.get("id"), str) and response["id"]:
            return str(response["id"])[:_ID_MAX]
    return None


def _longest(conn: Executes, sql: str, parents: list[str], rest: list[object]) -> tuple[Any, ...] | None:
    """`sql` (`continued` or `continued_in`: the longest prefix first) over `parents`. The longest prefix alone
    first: an agent's turn continues its previous one, whose digest is the last parent, and a row found for
    it is the one the whole lookup orders first (its `k` is the highest). One statement, compiled once, and
    one index probe, where the whole lookup's statement grew by a parent each turn (compiled again each
    time, probing every earlier turn). Found nothing: the whole lookup, as before."""
    last: list[object] = [parents[-1], len(parents) - 1]
    row = conn.execute(sql.format(values="(?, ?)"), [*last, *rest]).fetchone()
    if row is not None or len(parents) == 1:
        return None if row is None else tuple(row)
    values = ", ".join("(?, ?)" for _ in parents)
    args: list[object] = [x for k, h in enumerate(parents) for x in (h, k)]
    found = conn.execute(sql.format(values=values), [*args, *rest]).fetchone()
    return None if found is None else tuple(found)


class SessionTracker:
    """Lives in the writer thread; its memory: a cache of parsed conversation items, and in a transaction whether
    any session waits for a parent (`any_waiting`; the transaction holds the write lock, so only it adds one)."""

    def __init__(self, sql: SessionSQL) -> None:
        self.parser = Parser()
        self.sql = sql
        self._waiting: bool | None = None  # None: not asked in this transaction

    def end_batch(self) -> None:
        """The transaction ended: other writers may add waiting sessions before the next."""
        self._waiting = None

    def assign(
        self, conn: Executes, ex: Exchange, reply: Assembled, client: bytes, noted: NotedParse | None = None
    ) -> SessionLink:
        """`reply` and `client`: the answer as the client received it, assembled and as bytes; `noted`: the request
        side's parse of the body as forwarded (jsonbody.STORE_PARSE_KEY), used when it is the client's body."""
        surface = surface_for(ex.path)
        body = ex.readable_request()
        spans, items = _spans(body, CONVERSATION_FIELDS, noted_parse(noted, body))
        answered = ex.status is not None and 200 <= ex.status < 300
        conversation = self.parser.conversation(body, spans, items, surface) if spans else None
        # Replays and probes are copies, not turns an agent continues.
        own = not ex.session_hint and not ({"replay", "probe"} & ex.tags)
        chain = conversation.chained(reply_parts(reply)) if conversation and answered and own else None
        rid = response_id(client) if api_surface(surface).chains_ids and answered and own else None
        thread = ex.id if own else None  # a chain's first exchange names its thread
        parents = conversation.parents if conversation is not None else []
        key = explicit_key(ex, spans)
        if key:
            if own and parents:
                thread = self._thread_in(conn, parents, key) or thread
            return SessionLink(key, chain, rid, thread_id=thread)
        previous = _string(body, spans, "previous_response_id")
        if previous:
            row = conn.execute(self.sql.by_response, (previous,)).fetchone()
            if row is not None:
                return SessionLink(row[0], chain, rid, thread_id=str(row[1]) if own else None)
            return SessionLink(f"s-{ex.id}", chain, rid, wants=_RESPONSE_PREFIX + previous, thread_id=thread)
        if conversation is None:
            return SessionLink(None)
        if not parents:
            return SessionLink(f"s-{ex.id}", chain, rid, thread_id=thread)
        found = self._continued(conn, parents, ex)
        if found is not None:
            return SessionLink(found[0], chain, rid, thread_id=found[1] if own else None)
        return SessionLink(f"s-{ex.id}", chain, rid, wants=parents[-1], thread_id=thread)

    def _continued(self, conn: Executes, parents: list[str], ex: Exchange) -> tuple[str, str] | None:
        """One indexed lookup: the session and thread of the exchange behind the longest matching prefix."""
        row = _longest(conn, self.sql.continued, parents, [ex.client_addr, ex.user_agent])
        return None if row is None else (str(row[0]), str(row[1]))

    def _thread_in(self, conn: Executes, parents: list[str], session_id: str) -> str | None:
        """The thread of the exchange behind the longest matching prefix in this session, if any."""
        row = _longest(conn, self.sql.continued_in, parents, [session_id])
        return None if row is None else str(row[0])

    def record(self, conn: Executes, link: SessionLink, ex: Exchange) -> None:
        """After the exchange row is in: count it in its session, then take in a session that waited
        for it (its continuation, written first by another process)."""
        if not link.session_id:
            return
        when = datetime.datetime.fromtimestamp(ex.started_at, datetime.UTC).isoformat(timespec="milliseconds")
        conn.execute(
            self.sql.record,
            (link.session_id, when, when, ex.user_agent, ex.model, link.chain_hash, link.wants),
        )
        if link.wants:
            self._waiting = True
        for wanted in (link.chain_hash, link.response_id and _RESPONSE_PREFIX + link.response_id):
            if wanted:
                self._adopt(conn, link.session_id, wanted, ex)

    def _adopt(self, conn: Executes, session_id: str, wanted: str, ex: Exchange) -> None:
        if self.sql.adopt_waiting is not None:
            conn.execute(self.sql.adopt_waiting, (wanted, session_id, ex.user_agent, session_id, session_id))
            return
        if self.sql.any_waiting is not None:
            if self._waiting is None:
                self._waiting = conn.execute(self.sql.any_waiting).fetchone() is not None
            if not self._waiting:
                return
        row = conn.execute(self.sql.orphan, (wanted, session_id, ex.user_agent)).fetchone()
        if row is None:
            return
        orphan, first_at, last_at, count, tip = row
        conn.execute("update exchanges set session_id = ? where session_id = ?", (session_id, orphan))
        conn.execute(
            self.sql.adopt,
            (count, first_at, last_at, last_at, tip, session_id),
        )
        conn.execute("delete from sessions where id = ?", (orphan,))
