"""The token-volume report's SQL on SQLite (store/volume.py `Dialect`): each group's field, the browser's
filters (store/sqlite/filters.py), and the report's covering index."""

from __future__ import annotations

import sqlite3

from tapfix.proxy.store.sqlite.filters import where as sqlite_where
from tapfix.proxy.store.volume import Dialect, client_product, upstream_host

# `client` and `upstream` are grouped by their stored column and derived per group in Python (`derive`):
# SQLite's string functions over every row cost more than the whole sum (bench/stats.py).
VOLUME_FIELDS = {
    "model": "e.model",
    "route": "e.route",
    "upstream": "e.upstream_url",
    "client": "e.user_agent",
    "session": "e.session_id",
}


def volume_dialect(conn: sqlite3.Connection) -> Dialect:
    columns = {str(r[1]) for r in conn.execute("pragma table_info(exchanges)")}
    indexes = {str(r[1]) for r in conn.execute("pragma index_list(exchanges)")}
    return Dialect(
        fields=VOLUME_FIELDS,
        where=sqlite_where,
        repaired="exists (select 1 from changes c where c.exchange_id = e.id and c.stage = 'toolcalls')",
        hour="cast(e.ts / 3600 as integer) * 3600",
        derive={"client": client_product, "upstream": upstream_host},
        # its planner would rather walk the index of the grouped column (and read every wide row it points at)
        source="exchanges e indexed by idx_exchanges_volume" if "idx_exchanges_volume" in indexes else "exchanges e",
        columns=frozenset(columns),
    )
