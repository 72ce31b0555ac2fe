"""The token-volume report's SQL on PostgreSQL (store/volume.py `Dialect`): each group's field as
store/volume.py's Python says it, the browser's filters (store/pg/filters.py), `percentile_disc`."""

from __future__ import annotations

from tapfix.proxy.store.pg.filters import DAY, Rows, where
from tapfix.proxy.store.volume import Dialect

_UA_WORD = "split_part(e.user_agent, ' ', 1)"
_SLASH = f"strpos({_UA_WORD}, '/')"
VOLUME_FIELDS = {
    "model": "e.model",
    "route": "e.route",
    "upstream": "case when strpos(e.upstream_url, '://') > 0"
    " then nullif(split_part(split_part(e.upstream_url, '://', 2), '/', 1), '') end",
    "client": f"case when e.user_agent is null or e.user_agent = '' then null"
    f" when {_SLASH} > 0 and substr({_UA_WORD}, {_SLASH} + 1, 1) ~ '^[0-9]$'"
    f" then substr({_UA_WORD}, 1, {_SLASH} - 1) else {_UA_WORD} end",
    "session": "e.session_id",
}


def volume_dialect(store: Rows) -> Dialect:
    found = store.rows(
        "select column_name as c from information_schema.columns"
        " where table_name = 'exchanges' and table_schema = current_schema()"
    )
    columns = {str(r["c"]) for r in found}
    return Dialect(
        fields=VOLUME_FIELDS,
        where=where,
        repaired=f"exists (select 1 from changes c where c.exchange_id = e.id and c.day = {DAY}"
        " and c.stage = 'toolcalls')",
        hour="(floor(extract(epoch from e.started_at) / 3600) * 3600)::bigint",
        columns=frozenset(columns),
        percentile=lambda p, value: f"percentile_disc({p}) within group (order by {value})",
    )
