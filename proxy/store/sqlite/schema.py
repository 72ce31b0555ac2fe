"""The SQLite capture database's schema, as ordered named migrations. A shipped migration is never edited.

Plain tables with readable column names, so `sqlite-utils` and Datasette work out of the box:
`exchanges` (one row per request, regeneration attempts included), `changes` (what tapfix changed),
`bodies` (exact bytes, stored as deltas), `sessions` (agent runs), and the views `exchange_view` and
`exchange_bodies` (the latter needs the `tapfix_body` SQL function: store/sql_functions.py).
"""

from __future__ import annotations

from tapfix.proxy.store.sqlite.sqlite_utils_lite import MIGRATION_SET, import_sqlite_utils

import_sqlite_utils()  # before sqlite-utils is first imported: without numpy (see that module)
from sqlite_utils import Database  # noqa: E402
from sqlite_utils.db import Table  # noqa: E402
from sqlite_utils.migrations import Migrations  # noqa: E402

migrations = Migrations(MIGRATION_SET)


@migrations()
def m001_initial(db: Database) -> None:
    db.execute(
        """
        create table exchanges (
            id text primary key,
            ts real not null,                 -- unix time the request arrived
            started_at text not null,         -- the same, ISO 8601 UTC
            upstream_first_byte_ms real,      -- response headers from upstream, ms after arrival
            first_token_ms real,              -- first content/reasoning/tool-call token, ms after arrival
            duration_ms real,
            client_addr text,
            user_agent text,
            method text,
            path text,
            url text,
            upstream_url text,
            model text,
            served_model text,
            stream integer,
            status integer,
            error text,
            session_id text,
            source_id text,                   -- the capture this one replays
            tags text not null default '[]',  -- JSON list: probe, replay, ...
            flags text not null default '[]', -- JSON list: degeneration and fault flags
            changes_count integer not null default 0,
            request_body_id integer references bodies(id),
            forwarded_body_id integer references bodies(id),  -- only when it differs
            response_body_id integer references bodies(id),
            client_response_body_id integer references bodies(id),  -- only when it differs
            request_size integer,
            response_size integer,
            request_headers text,             -- JSON [[name, value], ...], secrets redacted
            forwarded_headers text,
            response_headers text,
            content text,
            reasoning text,
            tool_calls text,                  -- JSON list of {id, name, arguments}
            finish_reason text,
            usage text,
            prompt_tokens integer,
            completion_tokens integer,
            chunk_count integer,
            chunk_timing blob                 -- little-endian float32 ms offsets, then uint32 sizes
        )
        """
    )
    db.execute(
        """
        create table changes (
            id integer primary key,
            exchange_id text not null references exchanges(id),
            seq integer not null,
            stage text not null,
            kind text not null,
            path text,
            before text,                      -- JSON
            after text,                       -- JSON
            reason text
        )
        """
    )
    db.execute(
        """
        create table bodies (
            id integer primary key,
            sha256 text not null unique,
            size integer not null,
            base_id integer references bodies(id),
            prefix_len integer not null,
            suffix_len integer not null,
            encoding text not null,
            data blob not null,
            depth integer not null
        )
        """
    )
    db.execute(
        """
        create table sessions (
            id text primary key,
            first_at text,
            last_at text,
            user_agent text,
            model text,
            exchanges integer not null default 0
        )
        """
    )
    exchanges = Table(db, "exchanges")
    for columns in (["ts"], ["model"], ["user_agent"], ["status"], ["session_id"], ["source_id"], ["path"]):
        exchanges.create_index(columns)
    Table(db, "changes").create_index(["exchange_id"])
    Table(db, "bodies").create_index(["base_id"])
    db.execute(
        """
        create view exchange_view as
        select id, started_at, user_agent, method, path, model, served_model, stream, status,
               first_token_ms, duration_ms, finish_reason, changes_count, flags, tags, session_id,
               prompt_tokens, completion_tokens, substr(content, 1, 200) as content_start, error
        from exchanges order by id desc
        """
    )


@migrations()
def m002_choices(db: Database) -> None:
    """One row per `choices[i].index` of a chat response: `n > 1` answers are kept apart, not merged.
    The exchange row (and `exchange_view`) keeps choice 0."""
    db.execute(
        """
        create table choices (
            exchange_id text not null references exchanges(id),
            "index" integer not null,
            content text,
            reasoning text,
            tool_calls text,                  -- JSON list of {id, name, arguments}
            finish_reason text,
            flags text not null default '[]', -- JSON list, computed for this choice alone
            primary key (exchange_id, "index")
        )
        """
    )


@migrations()
def m003_sessions_from_data(db: Database) -> None:
    """Sessions derived from the stored rows, so several processes writing one store agree (see
    store/sessions.py): what a later turn looks its parent up by, and what a session waits for."""
    for statement in (
        # digest of the request's conversation followed by the reply the client received
        "alter table exchanges add column chain_hash text",
        "alter table exchanges add column response_id text",  # a Responses response id
        "alter table sessions add column tip_hash text",  # the chain_hash of the session's latest turn
        "alter table sessions add column wants text",  # the parent its first turn had not found yet
        "create index idx_exchanges_chain_hash on exchanges (chain_hash) where chain_hash is not null",
        "create index idx_exchanges_response_id on exchanges (response_id) where response_id is not null",
        "create index idx_sessions_wants on sessions (wants) where wants is not null",
    ):
        db.execute(statement)


@migrations()
def m004_attempts(db: Database) -> None:
    """Regeneration attempts (issue 19): each attempt tapfix makes upstream after an unrecoverable tool
    call is an exchange of its own, pointing at the client-facing capture it was made for. Existing
    rows are client-facing exchanges: `attempt_of` null, `attempt` 1."""
    for statement in (
        "alter table exchanges add column attempt_of text",  # the client-facing capture's id
        "alter table exchanges add column attempt integer not null default 1",  # 1 = client-facing; 2...N+1
        "create index idx_exchanges_attempt_of on exchanges (attempt_of) where attempt_of is not null",
    ):
        db.execute(statement)


@migrations()
def m005_trace_context(db: Database) -> None:
    """W3C trace context (issue 20): the trace an exchange belongs to (the client's `traceparent`, or the
    one tapfix started while OTLP export is on), tapfix's span in it, and the client's span, as lowercase
    hex; null when there is none. `trace_id` is indexed: a trace id pasted from a tracing backend finds
    its exchanges. `exchange_view` shows the trace id."""
    for statement in (
        "alter table exchanges add column trace_id text",
        "alter table exchanges add column span_id text",
        "alter table exchanges add column parent_span_id text",
        "create index idx_exchanges_trace_id on exchanges (trace_id) where trace_id is not null",
        "drop view exchange_view",
        """
        create view exchange_view as
        select id, started_at, user_agent, method, path, model, served_model, stream, status,
               first_token_ms, duration_ms, finish_reason, changes_count, flags, tags, session_id,
               prompt_tokens, completion_tokens, substr(content, 1, 200) as content_start, error, trace_id
        from exchanges order by id desc
        """,
    ):
        db.execute(statement)


@migrations()
def m006_exchange_bodies(db: Database) -> None:
    """`exchange_bodies`: each exchange with its request and response as text, for Datasette and
    sqlite-utils (their tapfix plugins register `tapfix_body`, store/sql_functions.py).

    A view, so nothing is stored twice. Only a connection with the function can read it: elsewhere
    (the sqlite3 shell, Datasette or sqlite-utils without tapfix installed) `select ... from
    exchange_bodies` fails with "no such function: tapfix_body", and every table still reads as
    before; tapfix's own readers, retention, purge, VACUUM and backup never use it. Unordered on
    purpose: `count(*)` over an ordered view would rebuild every body; ask for an order
    (`order by id desc`, Datasette's `?_sort_desc=id`) and only the rows shown are rebuilt.
    `forwarded` and `client_response` are set only where they differ from `request` / `response`."""
    db.execute(
        """
        create view exchange_bodies as
        select id, started_at, method, path, model, status, session_id,
               tapfix_body(id, 'request') as request,
               tapfix_body(id, 'response') as response,
               case when forwarded_body_id is not null then tapfix_body(id, 'forwarded') end as forwarded,
               case when client_response_body_id is not null then tapfix_body(id, 'client_response') end
                   as client_response
        from exchanges
        """
    )


@migrations()
def m007_threads(db: Database) -> None:
    """Threads within a session (store/sessions.py): the id of the first exchange of the chain of requests
    an exchange belongs to. One session may hold several (Claude Code's subagents send the main agent's
    session id). Rows written before it have none: a lookup reads their own id instead."""
    for statement in (
        "alter table exchanges add column thread_id text",
        "create index idx_exchanges_thread_id on exchanges (thread_id) where thread_id is not null",
    ):
        db.execute(statement)


@migrations()
def m008_prefix_break(db: Database) -> None:
    """Where an exchange's prompt stopped extending the previous request of its thread (issue 36,
    store/prefix_breaks.py): JSON text `{path, offset, cause, reason, previous, old, new, body}`, null when
    it extends it or starts its thread."""
    db.execute("alter table exchanges add column prefix_break text")


@migrations()
def m009_route_decision(db: Database) -> None:
    """Routes (issue 38): the decision that sent an exchange where it went, as JSON text
    (request/routes.py `Decision.record`): the route taken, the rule and its inputs, the routes rejected
    and why; null for a model without routes."""
    db.execute("alter table exchanges add column route_decision text")


# Where a usage object keeps its cached prompt tokens and its reasoning tokens, by surface: Chat
# Completions, Responses, Anthropic Messages (store/exchange_row.py `usage_details` reads the same paths).
CACHED_PATHS = (
    "$.prompt_tokens_details.cached_tokens",
    "$.input_tokens_details.cached_tokens",
    "$.cache_read_input_tokens",
)
MAX_COUNT = 2**31 - 1  # a count beyond this isn't a token count (and PostgreSQL's integer column can't hold it)
REASONING_PATHS = ("$.completion_tokens_details.reasoning_tokens", "$.output_tokens_details.reasoning_tokens")


# Every column the report reads (store/volume.py, store/sqlite/stats.py), the time first: the report reads
# this index alone, a narrow slice of the rows (which carry headers and answers), and a `--since` reads
# only its range of it. bench/stats.py measures it.
VOLUME_COLUMNS = (
    "ts",
    "model",
    "route",
    "upstream_url",
    "user_agent",
    "session_id",
    "status",
    "error",
    "changes_count",
    "attempt_of",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "first_token_ms",
    "duration_ms",
    "id",
)


@migrations()
def m010_route_and_token_details(db: Database) -> None:
    """The token-volume report (issue 38, `captures stats`): the route an exchange took (routing's, null
    without one), and the cached prompt tokens and reasoning tokens from its usage, as columns so the
    report's sums are SQL over columns, not JSON parsed per row. Rows already stored get them from
    their `usage`. `route` is indexed (a filter by route walks it), and the report has a covering index."""

    def first(paths: tuple[str, ...]) -> str:
        def one(path: str) -> str:
            value = f"json_extract(usage, '{path}')"
            return f"iif(json_type(usage, '{path}') = 'integer' and {value} between 0 and {MAX_COUNT}, {value}, null)"

        return "coalesce(" + ", ".join(one(p) for p in paths) + ")"

    for statement in (
        "alter table exchanges add column route text",
        "alter table exchanges add column cached_tokens integer",
        "alter table exchanges add column reasoning_tokens integer",
        "create index idx_exchanges_route on exchanges (route) where route is not null",
        f"create index idx_exchanges_volume on exchanges ({', '.join(VOLUME_COLUMNS)})",
        f"update exchanges set cached_tokens = {first(CACHED_PATHS)}, reasoning_tokens = {first(REASONING_PATHS)}"
        " where usage is not null and json_valid(usage)",
    ):
        db.execute(statement)
