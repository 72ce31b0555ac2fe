"""The sqlite-utils and Datasette plugins: `tapfix_body` on every connection they open.

Installed with tapfix through entry points (pyproject.toml: groups `sqlite_utils` and `datasette`),
so `sqlite-utils query captures/tapfix.db "select tapfix_body(id, 'request') from exchanges"` and
`datasette captures/tapfix.db` (the view `exchange_bodies`, migration m006) work without options.

The hook markers are built with pluggy, as both tools do (`HookimplMarker("sqlite_utils")` is what
`sqlite_utils.hookimpl` is), rather than imported from them: importing either package imports click,
and each tool loads this module while it starts. Nothing here imports mitmproxy or click
(tests/process/test_sql_plugins.py checks it in a fresh interpreter).

Both tools read SQLite files only; the functions are SQLite's (store/sql_functions.py). This
module stays at `tapfix.proxy.store.sql_plugins`: an installed tapfix's entry points name it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pluggy
from tapfix.proxy.store.sql_functions import register

sqlite_utils_hook = pluggy.HookimplMarker("sqlite_utils")
datasette_hook = pluggy.HookimplMarker("datasette")


@sqlite_utils_hook(specname="prepare_connection")
def sqlite_utils_prepare_connection(conn: sqlite3.Connection) -> None:
    """Every `sqlite_utils.Database`: the CLI's, a script's, and tapfix's own (its migrations).

    Python's sqlite3 reports every exception raised in an SQL function as "user-defined function
    raised exception"; with callback tracebacks on (sqlite-utils turns them on itself for
    `--functions` and `convert`), `tapfix_body`'s own message, which lists the kinds, is printed too."""
    sqlite3.enable_callback_tracebacks(True)
    register(conn)


@datasette_hook(specname="prepare_connection")
def datasette_prepare_connection(conn: sqlite3.Connection, database: str, datasette: Any) -> None:
    """Each of Datasette's connections (one per query thread, read-only or immutable)."""
    register(conn)


@datasette_hook(specname="render_cell")
def datasette_render_cell(value: object, column: str, table: str | None) -> str | None:
    """A body that isn't UTF-8 is a BLOB: in a view, Datasette 0.65 links a BLOB cell to its row by
    rowid, which a view hasn't, and the page fails; say what it is instead (the JSON keeps the bytes)."""
    if table == "exchange_bodies" and isinstance(value, bytes):
        return f"<binary body, {len(value):,} bytes: tapfix_body_bytes(id, '{column}') has them>"
    return None
