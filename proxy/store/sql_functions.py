"""`tapfix_body(exchange_id, kind)` and `tapfix_body_bytes(...)`: a capture's bodies from plain SQL.

Why: bodies are stored as delta chains (store/sqlite/bodies.py), so `sqlite-utils`, Datasette or
Python's `sqlite3` see compressed fragments, not a request. `register(conn)` adds two SQL functions that
rebuild a body with the store's own reader, on any connection: read-only and immutable ones too
(Datasette opens files that way), since they only read. The sqlite-utils and Datasette plugins
(store/sql_plugins.py) call it; so can a script (the README shows how: this module stays at
`tapfix.proxy.store.sql_functions`, though its store is SQLite's). This module imports only the body reader: no
mitmproxy, no click (both plugins load it into tools that must start fast).

- kind is one of `BODY_KINDS`; `forwarded` and `client_response` fall back to `request` and
  `response`, which is how they are stored when nothing changed (a NULL body id);
- NULL when the exchange id is unknown or its bodies weren't stored (`--no-bodies`);
- `tapfix_body` is TEXT when the bytes are valid UTF-8 (a JSON request, an SSE stream), else a
  BLOB (a compressed or binary body); `tapfix_body_bytes` is always the exact bytes, a BLOB.

Interrupting the calling statement (`conn.interrupt()`, a progress handler's time limit) interrupts
the function's own reads, and the statement then fails as interrupted.

An unknown kind is an error. Python's `sqlite3` reports any exception from a function as
"user-defined function raised exception"; the exception itself (`UnknownKind`, which lists the
kinds) reaches `sys.unraisablehook` once `sqlite3.enable_callback_tracebacks(True)` is on, which
the sqlite-utils plugin does for its command line.
"""

from __future__ import annotations

import sqlite3

from tapfix.proxy.store.bodies import BODY_KINDS, FALLBACK_KIND
from tapfix.proxy.store.sqlite.bodies import DECODED_MAX_BODIES, BodyReader

_IDS = (
    "select request_body_id, forwarded_body_id, response_body_id, client_response_body_id from exchanges where id = ?"
)
_COLUMN = {kind: i for i, kind in enumerate(BODY_KINDS)}  # the kind's position in `_IDS`


class UnknownKind(ValueError):
    """The kind argument isn't one of the four bodies an exchange has."""

    def __init__(self, kind: object) -> None:
        super().__init__(f"tapfix_body: unknown kind {kind!r}: use one of {', '.join(BODY_KINDS)}")


def register(conn: sqlite3.Connection, *, max_bodies: int = DECODED_MAX_BODIES) -> None:
    """Add `tapfix_body` and `tapfix_body_bytes` to this connection. Each connection has its own
    reader, keeping up to `max_bodies` inflated pieces of bodies (0: none; bench/sql_bodies.py compares)."""
    bodies = _Bodies(conn, max_bodies)
    conn.create_function("tapfix_body", 2, bodies.text_or_blob)
    conn.create_function("tapfix_body_bytes", 2, bodies.exact)


class _Bodies:
    """The two functions' shared state: the connection they query, and its body reader."""

    def __init__(self, conn: sqlite3.Connection, max_bodies: int) -> None:
        self.conn = conn
        self.reader = BodyReader(conn, max_bodies=max_bodies)

    def exact(self, exchange_id: object, kind: object) -> bytes | None:
        column = _COLUMN.get(kind) if isinstance(kind, str) else None
        if column is None:
            raise UnknownKind(kind)
        if not isinstance(exchange_id, str):
            return None  # NULL, or a number: no exchange has such an id
        try:
            row = self.conn.execute(_IDS, (exchange_id,)).fetchone()
            if row is None:
                return None
            body_id = row[column]
            if body_id is None and kind in FALLBACK_KIND:
                body_id = row[_COLUMN[FALLBACK_KIND[kind]]]
            return self.reader.read(body_id)
        except sqlite3.OperationalError as e:
            if e.args != ("interrupted",):
                raise
            # A time limit (Datasette's: a progress handler) stopped our own query: stop the caller's
            # statement the same way, so it fails as "interrupted" (a slow query, which Datasette
            # handles), not as a broken function (an error page).
            self.conn.interrupt()
            return None

    def text_or_blob(self, exchange_id: object, kind: object) -> str | bytes | None:
        data = self.exact(exchange_id, kind)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data
