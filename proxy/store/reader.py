"""Read side of the store for the CLI (and anything else that only reads): list, resolve, load."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from tapfix.proxy.store.bodies import FALLBACK_KIND, read_body
from tapfix.proxy.store.writer import StoreError


class CaptureNotFound(StoreError):
    pass


LIST_COLUMNS = (
    "id, started_at, method, path, model, status, user_agent, stream, changes_count, flags, tags, "
    "first_token_ms, duration_ms, finish_reason, error, session_id, source_id"
)
# A store from before migration m004 (a reader never migrates) has no attempts: every row is client-facing.
_NO_ATTEMPTS = "null as attempt_of, 1 as attempt"
# A client request, or an attempt listed on its own because its parent isn't in the store.
ORPHAN_OR_CLIENT = (
    "attempt_of is null or not exists (select 1 from exchanges parent where parent.id = exchanges.attempt_of)"
)


def has_column(conn: sqlite3.Connection, column: str) -> bool:
    """Whether the store's exchanges have `column`: readers read older stores as they are."""
    return any(row[1] == column for row in conn.execute("pragma table_info(exchanges)"))


def has_attempts(conn: sqlite3.Connection) -> bool:
    """Whether the store has the attempt columns (migration m004)."""
    return has_column(conn, "attempt_of")


def attempt_columns(conn: sqlite3.Connection, table: str = "exchanges") -> str:
    """`attempt_of, attempt` for a select list, on any store."""
    return f"{table}.attempt_of, {table}.attempt" if has_attempts(conn) else _NO_ATTEMPTS


def list_columns(conn: sqlite3.Connection) -> str:
    """What `captures list` and `captures tail` select, on any store: trace_id is null before m005."""
    trace = "exchanges.trace_id" if has_column(conn, "trace_id") else "null as trace_id"
    return f"{LIST_COLUMNS}, {attempt_columns(conn)}, {trace}"


@dataclass(frozen=True, slots=True)
class CaptureFilter:
    """What `captures list` and `captures tail` select by: client requests with this flag, tag, session
    or trace id (None: any). An attempt goes with its client request (see `list_captures`)."""

    flag: str | None = None
    tag: str | None = None
    session: str | None = None
    trace: str | None = None

    def asked(self) -> str:
        """The filters as the command line spells them: `--flag F, --trace T`."""
        return ", ".join(f"--{key} {value}" for key, value in self._given())

    def clauses(self, conn: sqlite3.Connection, table: str = "exchanges") -> tuple[list[str], list[Any]]:
        """SQL conditions on `table` (a name or an alias of exchanges), and their arguments. On a store
        from before migration m005 a trace id matches nothing."""
        where: list[str] = []
        args: list[Any] = []
        for key, value in self._given():
            if key in ("flag", "tag"):
                where.append(f"exists (select 1 from json_each({table}.{key}s) where value = ?)")
            elif key == "session":
                where.append(f"{table}.session_id = ?")
            elif has_column(conn, "trace_id"):
                where.append(f"{table}.trace_id = ?")
            else:
                where.append("0")
                continue
            args.append(value.lower() if key == "trace" else value)
        return where, args

    def _given(self) -> list[tuple[str, str]]:
        given = (("flag", self.flag), ("tag", self.tag), ("session", self.session), ("trace", self.trace))
        return [(key, value) for key, value in given if value]


def list_captures(
    conn: sqlite3.Connection,
    *,
    limit: int = 20,
    flag: str | None = None,
    tag: str | None = None,
    session: str | None = None,
    trace: str | None = None,
) -> list[dict[str, Any]]:
    """Client requests newest first, each followed by its regeneration attempts (issue 19) in order.

    The filters and `limit` are about client requests: an attempt is listed under its parent, whatever
    it carries itself (it has no session; its flags say what went wrong upstream, and the parent
    carries `regenerated`). An attempt whose parent isn't in the store is listed on its own."""
    attempts = has_attempts(conn)
    where, args = CaptureFilter(flag, tag, session, trace).clauses(conn)
    if attempts:
        where.insert(0, f"({ORPHAN_OR_CLIENT})")
    sql = f"select {list_columns(conn)} from exchanges"
    if where:
        sql += " where " + " and ".join(where)
    sql += " order by id desc"
    if limit > 0:
        sql += f" limit {int(limit)}"
    rows = [decode_row(dict(row)) for row in conn.execute(sql, args)]
    if not attempts or not rows:
        return rows
    return _with_attempts(conn, rows)


def _with_attempts(conn: sqlite3.Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each listed client request followed by its attempts (one query per 500 parents)."""
    ids = [row["id"] for row in rows if row["attempt_of"] is None]
    children: dict[str, list[dict[str, Any]]] = {}
    columns = list_columns(conn)
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        for row in conn.execute(
            f"select {columns} from exchanges"
            f" where attempt_of in ({','.join('?' * len(part))}) order by attempt_of, attempt, id",
            part,
        ):
            child = decode_row(dict(row))
            children.setdefault(child["attempt_of"], []).append(child)
    out: list[dict[str, Any]] = []
    for row in rows:
        out.append(row)
        out.extend(children.get(row["id"], ()) if row["attempt_of"] is None else ())
    return out


def known_flags(conn: sqlite3.Connection) -> list[str]:
    """Every flag some capture in the store carries (what `captures list --flag` can match)."""
    rows = conn.execute(
        "select distinct j.value from exchanges, json_each(exchanges.flags) j where exchanges.flags != '[]'"
    )
    return sorted(str(r[0]) for r in rows)


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the CLI shows it: JSON columns parsed, `stream` a bool, `changes` the count."""
    for key in ("flags", "tags", "request_headers", "forwarded_headers", "response_headers", "tool_calls", "usage"):
        if key in row and isinstance(row[key], str):
            row[key] = orjson.loads(row[key])
    if "stream" in row and row["stream"] is not None:
        row["stream"] = bool(row["stream"])
    row["changes"] = row.pop("changes_count", 0)
    return row


def resolve_id(conn: sqlite3.Connection, prefix: str) -> str:
    prefix = prefix.strip().lower()
    if not prefix:
        raise CaptureNotFound("empty capture id")
    rows = conn.execute(
        "select id from exchanges where id >= ? and id < ? order by id limit 3", (prefix, prefix + "\uffff")
    ).fetchall()
    if not rows:
        raise CaptureNotFound(f"no capture with id {prefix!r} (see `tapfix captures list`)")
    if len(rows) > 1 and rows[0][0] != prefix:
        ids = ", ".join(r[0] for r in rows)
        raise CaptureNotFound(f"capture id {prefix!r} is ambiguous: {ids}, ...")
    found: str = rows[0][0]
    return found


def load_capture(conn: sqlite3.Connection, capture_id: str) -> dict[str, Any]:
    capture_id = resolve_id(conn, capture_id)
    row = conn.execute("select * from exchanges where id = ?", (capture_id,)).fetchone()
    capture = decode_row(dict(row))
    capture["change_rows"] = [
        {
            **dict(c),
            "before": orjson.loads(c["before"]) if c["before"] else None,
            "after": orjson.loads(c["after"]) if c["after"] else None,
        }
        for c in conn.execute(
            "select stage, kind, path, before, after, reason from changes where exchange_id = ? order by seq",
            (capture_id,),
        )
    ]
    return capture


def body_id_of(capture: dict[str, Any], which: str) -> int | None:
    """The stored body behind `which` (request | forwarded | response | client_response), or None."""
    body_id: int | None = capture[f"{which}_body_id"]  # indexed, not .get(): sqlite3.Row rows come here too
    if body_id is None and which in FALLBACK_KIND:
        body_id = capture[f"{FALLBACK_KIND[which]}_body_id"]
    return body_id


def capture_body(conn: sqlite3.Connection, capture: dict[str, Any], which: str) -> bytes:
    """which: request | forwarded | response | client_response — exact bytes."""
    body_id = body_id_of(capture, which)
    if body_id is None:
        if capture.get("request_body_id") is None and capture.get("request_size"):
            raise StoreError(f"capture {capture['id']} was stored without bodies (privacy mode)")
        return b""
    data = read_body(conn, body_id)
    return data or b""


class CaptureReader(Protocol):
    """What `captures list`, `show` and `export` read through, on either backend (`open_reader`):
    `SqliteReader` here, `PostgresReader` in store/pg/reader.py. The same exchanges give the same
    rows and bytes on both (tests/unit/test_store_reader_backends.py)."""

    backend: str

    def list_captures(
        self,
        *,
        limit: int = 20,
        flag: str | None = None,
        tag: str | None = None,
        session: str | None = None,
        trace: str | None = None,
    ) -> list[dict[str, Any]]: ...
    def known_flags(self) -> list[str]: ...
    def resolve_id(self, prefix: str) -> str: ...
    def load_capture(self, capture_id: str) -> dict[str, Any]: ...
    def capture_body(self, capture: dict[str, Any], which: str) -> bytes: ...
    def read_choices(self, exchange_id: str) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...


class SqliteReader:
    """The functions above on one read-only SQLite connection, as a `CaptureReader`."""

    backend = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def list_captures(
        self,
        *,
        limit: int = 20,
        flag: str | None = None,
        tag: str | None = None,
        session: str | None = None,
        trace: str | None = None,
    ) -> list[dict[str, Any]]:
        return list_captures(self.conn, limit=limit, flag=flag, tag=tag, session=session, trace=trace)

    def known_flags(self) -> list[str]:
        return known_flags(self.conn)

    def resolve_id(self, prefix: str) -> str:
        return resolve_id(self.conn, prefix)

    def load_capture(self, capture_id: str) -> dict[str, Any]:
        return load_capture(self.conn, capture_id)

    def capture_body(self, capture: dict[str, Any], which: str) -> bytes:
        return capture_body(self.conn, capture, which)

    def read_choices(self, exchange_id: str) -> list[dict[str, Any]]:
        from tapfix.proxy.store.choices import read_choices

        return read_choices(self.conn, exchange_id)

    def close(self) -> None:
        self.conn.close()
