"""The token-volume report's SQL on SQLite (store/volume.py `Dialect`): each group's field as store/volume.py's
Python says it, the browser's filters (store/sqlite/filters.py), and the report's covering index."""

from __future__ import annotations

import sqlite3

from tapfix.proxy.store.sqlite.filters import where as sqlite_where
from tapfix.proxy.store.volume import LATE_COLUMNS, Dialect

_UA_WORD = "substr(e.user_agent, 1, instr(e.user_agent || ' ', ' ') - 1)"
_SLASH = f"instr({_UA_WORD}, '/')"
_AFTER_SCHEME = "substr(e.upstream_url, instr(e.upstream_url, '://') + 3)"
VOLUME_FIELDS = {
    "model": "e.model",
    "route": "e.route",
    "upstream": f"case when instr(e.upstream_url, '://') > 0 then nullif(substr({_AFTER_SCHEME}, 1,"
    f" instr({_AFTER_SCHEME} || '/', '/') - 1), '') end",
    "client": f"case when e.user_agent is null or e.user_agent = '' then null"
    f" when {_SLASH} > 0 and substr({_UA_WORD}, {_SLASH} + 1, 1) between '0' and '9'"
    f" then substr({_UA_WORD}, 1, {_SLASH} - 1) else {_UA_WORD} end",
    "session": "e.session_id",
}


def volume_dialect(conn: sqlite3.Connection) -> Dialect:
    columns = {str(r[1]) for r in conn.execute("pragma table_info(exchanges)")}
    indexes = {str(r[1]) for r in conn.execute("pragma index_list(exchanges)")}
    fields = dict(VOLUME_FIELDS)
    if "route" not in columns:
        fields["route"] = "cast(null as text)"
    return Dialect(
        fields=fields,
        where=sqlite_where,
        repaired="exists (select 1 from changes c where c.exchange_id = e.id and c.stage = 'toolcalls')",
        hour="cast(e.ts / 3600 as integer) * 3600",
        # its planner would rather walk the index of the grouped column (and read every wide row it points at)
        source="exchanges e indexed by idx_exchanges_volume" if "idx_exchanges_volume" in indexes else "exchanges e",
        columns=frozenset(c for c in LATE_COLUMNS if c in columns),
    )
