"""The browser's queries (store/parts.py `BrowseQueries`), what every backend shares: `BrowseBase`, the logic
of each page's reads over a backend's SQL, and `CachedStore`, the caching and threads under it.

Why one logic: the same exchanges give the same pages on every backend (tests/unit/test_browse_backends.py),
so what is done with the rows (a page cut from `limit + 1`, an attempt's reasons, a session's
neighbours and totals, a session's turns with their bodies) is written once. The SQL is in qmark
style (`?`) for both; a statement the databases spell alike is here, one they spell apart is the
backend's (store/sqlite/browse.py, store/pg/browse.py), as are the list page and the stats page,
whose search and aggregates differ most.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import orjson
from tapfix.proxy.store.pages import PAGE, TURNS_PAGE, SessionPage, SessionTurns, decode_flags

T = TypeVar("T")


def _json(text: str | None) -> Any:
    return orjson.loads(text) if text else None


CHANGE_REASONS_LIMIT = 20  # why an attempt was made, per attempt: its tool-call change rows


class CachedStore:
    """Stale-while-revalidate caching of aggregates, and work on threads of its own, for either backend."""

    transient: tuple[type[Exception], ...] = ()  # what a background refresh shrugs off (the next one retries)

    def __init__(self) -> None:
        self._cache: dict[str, tuple[float, Any]] = {}
        self._refreshing: set[str] = set()

    def cached(self, key: str, ttl: float, compute: Callable[[], T]) -> T:
        """Only the very first request waits for an aggregate over the whole store; later ones get the
        last value while a thread recomputes it."""
        hit = self._cache.get(key)
        if hit is None:
            value = compute()
            self._cache[key] = (time.monotonic(), value)
            while len(self._cache) > 128:  # one entry per filter combination: keep the newest
                self._cache.pop(next(iter(self._cache)))
            return value
        if time.monotonic() - hit[0] >= ttl and key not in self._refreshing:
            self._refreshing.add(key)
            threading.Thread(target=self._refresh, args=(key, compute), daemon=True).start()
        return hit[1]  # type: ignore[no-any-return]  # one key is always computed by the same function

    def in_thread(self, compute: Callable[[], Any]) -> None:
        """Run `compute` (say, warming a cache at start) on its own thread."""
        threading.Thread(target=self._refresh, args=(None, compute), daemon=True).start()

    def _refresh(self, key: str | None, compute: Callable[[], Any]) -> None:
        try:
            value = compute()
            if key is not None:
                self._cache[key] = (time.monotonic(), value)
        except self.transient:
            pass  # keep the stale value; the next request tries again
        finally:
            if key is not None:
                self._refreshing.discard(key)
            self.thread_done()

    def thread_done(self) -> None:
        """A thread of `_refresh` ends: release what it holds."""

    def start(self) -> None:
        """The browser starts serving: background work may begin (SQLite's search index keeps up)."""

    def catch_up(self) -> None:
        """Bring search up to date with the store now (SQLite's sidecar; PostgreSQL's is the writer's)."""

    def stats_complete(self) -> bool:
        """Whether the stats page's numbers are whole (SQLite's derived ones wait for the search index)."""
        return True


class BrowseBase(CachedStore):
    """`BrowseQueries` over a backend's SQL. A backend supplies `rows` and the attributes and methods that
    raise `NotImplementedError`; `ORDER` is the column lists follow (SQLite's `rowid`, write order;
    PostgreSQL's capture `id`, arrival order: store/pages.py says why)."""

    ORDER: str
    CLIENT = "user_agent"  # what the clients' suggestions group by
    FLAG_COUNTS: str  # the flags' suggestions: rows (v, n)
    TURN_COLUMNS: str  # what the session page shows of a turn, besides its `request_body_id`
    SESSION_TOTALS: str  # each session's totals over its exchanges; `{ids}`: the condition on `session_id`
    ATTEMPTS = (
        "select id, attempt, started_at, status, duration_ms, first_token_ms, finish_reason, flags,"
        " changes_count, error{day} from exchanges e where attempt_of = ? order by attempt, {order} limit 200"
    )

    def rows(self, sql: str, args: list[Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        raise NotImplementedError

    def decode(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row as the pages read it: its times as text, its JSON lists parsed."""
        return decode_flags(self.times(row))

    def times(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row's times as the SQLite store's ISO text (what SQLite stores already)."""
        return row

    def facets(self) -> dict[str, list[tuple[str, int]]]:
        """Values for the filter form's suggestions; cached, they cost a scan of an index each."""

        def compute() -> dict[str, list[tuple[str, int]]]:
            out = {}
            for name, c in (("models", "model"), ("clients", self.CLIENT), ("paths", "path")):
                sql = f"select {c} as v, count(*) as n from exchanges where {c} is not null group by {c}"
                out[name] = self._counts(sql + " order by 2 desc limit 60")
            out["flags"] = self._counts(self.FLAG_COUNTS)
            return out

        return self.cached("facets", 30.0, compute)

    def _counts(self, sql: str) -> list[tuple[str, int]]:
        return [(r["v"], r["n"]) for r in self.rows(sql)]

    def replays_of(self, capture_id: str) -> list[dict[str, Any]]:
        sql = (
            "select id, started_at, status, duration_ms, first_token_ms, flags, changes_count from exchanges"
            f" where source_id = ? order by {self.ORDER} desc limit 200"
        )
        return [self.decode(r) for r in self.rows(sql, (capture_id,))]

    def attempts_of(self, capture_id: str) -> list[dict[str, Any]]:
        """The regeneration attempts made for a client-facing capture, in order, each with why it was made
        (the reasons of its tool-call change rows)."""
        day, on_day = self._day_column()
        rows = self.rows(self.ATTEMPTS.format(day=day, order=self.ORDER), (capture_id,))
        for row in rows:
            self.decode(row)
            days = (row.pop("day"),) if on_day else ()
            row["reasons"] = [
                str(r["reason"])
                for r in self.rows(
                    f"select reason from changes where exchange_id = ?{on_day} and stage = 'toolcalls'"
                    " and reason is not null and reason <> '' group by reason order by min(seq) limit ?",
                    (row["id"], *days, CHANGE_REASONS_LIMIT),
                )
            ]
        return rows

    def session_neighbours(self, capture: Mapping[str, Any]) -> tuple[str | None, str | None]:
        """The turns before and after this one in its session."""
        if not capture.get("session_id"):
            return None, None
        at = self._position(capture["id"])
        found = []
        for op, order in (("<", "desc"), (">", "asc")):
            row = self.rows(
                f"select id from exchanges where session_id = ? and {self.ORDER} {op} ?"
                f" order by {self.ORDER} {order} limit 1",
                (capture["session_id"], at),
            )
            found.append(str(row[0]["id"]) if row else None)
        return found[0], found[1]

    def list_sessions(self, *, before: str = "", limit: int = PAGE) -> SessionPage:
        """Agent runs, most recently active first (the index on sessions (last_at, id)), with totals."""
        cond, args = "", []
        if before:
            cursor = self.rows("select last_at, id from sessions where id = ?", (before,))
            if cursor:
                cond, args = " where (last_at, id) < (?, ?)", [cursor[0]["last_at"], cursor[0]["id"]]
        rows = self.rows(f"select * from sessions{cond} order by last_at desc, id desc limit ?", [*args, limit + 1])
        page = SessionPage.of([self.decode(r) for r in rows], limit)
        ids = [r["id"] for r in page.rows]
        if ids:
            where, ids_args = self._in("session_id", ids)
            page.add_totals(self.rows(self.SESSION_TOTALS.format(ids=where), ids_args))
        return page

    def load_session(self, session_id: str, *, after: str = "", limit: int = TURNS_PAGE) -> SessionTurns | None:
        """One agent run turn by turn; `after`: the cursor the page before gave (`later`; '' from the start)."""
        session = self.rows("select * from sessions where id = ?", (session_id,))
        total = self.rows("select count(*) as n from exchanges where session_id = ?", (session_id,))[0]["n"]
        if not session and not total:
            return None
        start = self._turn_cursor(after)
        day, _ = self._day_column()
        rows = self.rows(
            f"select {self.TURN_COLUMNS}, request_body_id{day} from exchanges e"
            f" where session_id = ? and {self.ORDER} > ? order by {self.ORDER} limit ?",
            (session_id, start, limit + 1),
        )
        later = self._later(rows[limit - 1]) if len(rows) > limit else None
        rows = rows[:limit]
        earlier = self.rows(
            f"select count(*) as n from exchanges where session_id = ? and {self.ORDER} <= ?", (session_id, start)
        )[0]["n"]
        prev = []
        if start:
            prev = self.rows(
                f"select request_body_id{day} from exchanges e where session_id = ? and {self.ORDER} <= ?"
                f" order by {self.ORDER} desc limit 1",
                (session_id, start),
            )
        changes: dict[str, list[dict[str, Any]]] = {}
        if rows:
            where, args = self._changes_of(rows)
            for r in self.rows(
                f"select exchange_id, stage, kind, path, reason from changes where {where} order by exchange_id, seq",
                args,
            ):
                changes.setdefault(r.pop("exchange_id"), []).append(r)
        body = self._request_bodies()
        breaks = self._prefix_breaks([row["id"] for row in rows])
        for row in rows:
            row["request"] = body(row)
            row["prefix_break"], row["usage"] = breaks.get(row["id"], (None, None))
            self.times(row)  # flags and tool calls: the session page parses them
        return SessionTurns(
            self.decode(session[0]) if session else {"id": session_id},
            rows,
            changes,
            first_number=1 + int(earlier),
            previous=body(prev[0]) if prev else None,
            continues=bool(prev),
            later=later,
            total=total,
        )

    def _prefix_breaks(self, ids: list[str]) -> dict[str, tuple[Any, Any]]:
        """The turns' prefix breaks (store/prefix_breaks.py) and usage (for their cached prompt tokens), by id;
        none in a store from before the column."""
        if not ids:
            return {}
        where, args = self._in("id", ids)
        try:
            found = self.rows(f"select id, prefix_break, usage from exchanges where {where}", args)
        except self.transient:  # readers read an older store as it is
            return {}
        return {r["id"]: (_json(r["prefix_break"]), _json(r["usage"])) for r in found}

    # The backend's part.

    def _day_column(self) -> tuple[str, str]:
        """(a select list's `, day` column, a condition on the changes' day) where rows are filed by day;
        ('', '') where they aren't."""
        return "", ""

    def _in(self, column: str, values: list[Any]) -> tuple[str, list[Any]]:
        """`column` is one of `values`: the condition and its arguments."""
        raise NotImplementedError

    def _position(self, capture_id: str) -> Any:
        """Where a capture stands in `ORDER`."""
        raise NotImplementedError

    def _turn_cursor(self, after: str) -> Any:
        """The `ORDER` value a session page's `after` names."""
        raise NotImplementedError

    def _later(self, row: dict[str, Any]) -> int | str:
        """The cursor a page ending at `row` gives for the next."""
        raise NotImplementedError

    def _changes_of(self, rows: list[dict[str, Any]]) -> tuple[str, list[Any]]:
        """The condition on `changes` for these turns' rows, and its arguments."""
        where, args = self._in("exchange_id", [r["id"] for r in rows])
        return where, args

    def _request_bodies(self) -> Callable[[dict[str, Any]], bytes | None]:
        """What reads a turn's request body from its row (`request_body_id`, taken out of the row);
        None when it can't be read (a damaged chain): the turn shows without it."""
        raise NotImplementedError
