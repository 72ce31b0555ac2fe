"""The PostgreSQL capture schema, as ordered named migrations. A shipped migration is never edited.

The set is PostgreSQL's own (migrations are one set per backend), and reaches the schema of SQLite's
whole list (store/sqlite/schema.py m001...m006) with the same tables, columns and views, so one reader's
SQL and `captures copy` carry over; tests/process/test_store_pg_schema.py compares the column names, so
the two can't drift. What differs, and why:

- Day partitions. `exchanges` is partitioned by range on `started_at` (timestamptz, UTC days);
  `bodies`, `changes` and `choices` by range on a `day` column (the UTC date of their exchange's
  `started_at`), with the same daily bounds, so age retention drops one day of all four at once
  and deletes rows only in the day that straddles the cutoff. Each has a default partition for
  rows no day partition takes (a skewed clock); `tapfix_add_day(date)` makes a day ahead of time
  (moving any of its rows out of the default partition). PostgreSQL requires a partitioned
  table's primary key to include the partition key: hence `(id, started_at)` and `(id, day)`.
  Ids stay unique across instances because they carry 30 random bits beside the millisecond
  (proxy/ids.py) and are looked up, not enforced, per partition.
- No foreign keys (SQLite runs with `foreign_keys = off` too): they would make dropping a day
  partition impossible without first dropping each constraint, and cost a look-up per insert.
- Ids are `collate "C"`: ordered bytewise, as SQLite's BINARY, so `order by id desc` means the same
  on both, and the primary key's btree serves equality, `id like 'prefix%'` (the CLI's id
  prefixes) and the newest-first order with one index (no separate text_pattern_ops index).
- Filter indexes are `(column, id)`: a browser page is "this filter, newest first, 50 rows", which
  such an index answers without sorting.
- Search (PostgreSQL only): `search_text` holds an exchange's new text (the turn's new messages and
  the answer, what the browser's SQLite sidecar indexes), and `search` its tsvector (`simple`
  configuration: no stemming, any language), both written by the writer; a GIN index on `search`
  for words, a pg_trgm GIN index on `search_text` for substrings and CJK text.
- Types: timestamps are timestamptz, binary columns bytea, ids of bodies bigint; JSON columns stay
  text as on SQLite, so readers decode them the same way.
"""

from __future__ import annotations

from tapfix.proxy.store.pg.bodies import EXCHANGE_BODIES, FUNCTIONS

# Day partitions are made by one process at a time (two instances starting at midnight).
ADD_DAY_LOCK = 0x7461706669780001
# Retention's collect step holds it exclusively, the body writer shared before taking a base (store/pg/retention.py).
RETENTION_LOCK = 0x7461706669780002

TABLES = """
do $$
begin
    if (select pg_encoding_to_char(encoding) from pg_database where datname = current_database()) <> 'UTF8' then
        raise exception 'tapfix needs a UTF8 database (this one is %): create it with ENCODING ''UTF8''',
            (select pg_encoding_to_char(encoding) from pg_database where datname = current_database());
    end if;
end
$$;

create extension if not exists pg_trgm;

create table exchanges (
    id text collate "C" not null,
    ts double precision not null,          -- unix time the request arrived
    started_at timestamptz not null,       -- the same; the partition key
    upstream_first_byte_ms double precision,
    first_token_ms double precision,
    duration_ms double precision,
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
    session_id text collate "C",
    source_id text collate "C",
    tags text not null default '[]',
    flags text not null default '[]',
    changes_count integer not null default 0,
    request_body_id bigint,
    forwarded_body_id bigint,
    response_body_id bigint,
    client_response_body_id bigint,
    request_size bigint,
    response_size bigint,
    request_headers text,
    forwarded_headers text,
    response_headers text,
    content text,
    reasoning text,
    tool_calls text,
    finish_reason text,
    usage text,
    prompt_tokens integer,
    completion_tokens integer,
    chunk_count integer,
    chunk_timing bytea,
    chain_hash text,
    response_id text,
    attempt_of text collate "C",
    attempt integer not null default 1,
    trace_id text,
    span_id text,
    parent_span_id text,
    search_text text,
    search tsvector,
    primary key (id, started_at)
) partition by range (started_at);
create table exchanges_default partition of exchanges default;

create sequence changes_id_seq as bigint;
create table changes (
    id bigint not null default nextval('changes_id_seq'),
    exchange_id text collate "C" not null,
    seq integer not null,
    stage text not null,
    kind text not null,
    path text,
    before text,
    after text,
    reason text,
    day date not null,
    primary key (id, day)
) partition by range (day);
alter sequence changes_id_seq owned by changes.id;
create table changes_default partition of changes default;

create sequence bodies_id_seq as bigint;
create table bodies (
    id bigint not null default nextval('bodies_id_seq'),
    sha256 text not null,
    size bigint not null,
    base_id bigint,
    prefix_len bigint not null,
    suffix_len bigint not null,
    encoding text not null default 'raw' check (encoding = 'raw'),
    data bytea not null,
    depth integer not null,
    day date not null,
    primary key (id, day),
    unique (day, sha256)
) partition by range (day);
alter sequence bodies_id_seq owned by bodies.id;
create table bodies_default partition of bodies default;

create table choices (
    exchange_id text collate "C" not null,
    "index" integer not null,
    content text,
    reasoning text,
    tool_calls text,
    finish_reason text,
    flags text not null default '[]',
    day date not null,
    primary key (exchange_id, "index", day)
) partition by range (day);
create table choices_default partition of choices default;

create table sessions (
    id text collate "C" primary key,
    first_at timestamptz,
    last_at timestamptz,
    user_agent text,
    model text,
    exchanges integer not null default 0,
    tip_hash text,
    wants text
);

create index exchanges_started_at on exchanges (started_at);
create index exchanges_model on exchanges (model, id);
create index exchanges_user_agent on exchanges (user_agent, id);
create index exchanges_status on exchanges (status, id);
create index exchanges_session_id on exchanges (session_id, id);
create index exchanges_source_id on exchanges (source_id) where source_id is not null;
create index exchanges_path on exchanges (path, id);
create index exchanges_chain_hash on exchanges (chain_hash) where chain_hash is not null;
create index exchanges_response_id on exchanges (response_id) where response_id is not null;
create index exchanges_attempt_of on exchanges (attempt_of) where attempt_of is not null;
create index exchanges_trace_id on exchanges (trace_id) where trace_id is not null;
create index exchanges_search on exchanges using gin (search);
create index exchanges_search_text on exchanges using gin (search_text gin_trgm_ops);
create index changes_exchange_id on changes (exchange_id);
create index bodies_base_id on bodies (base_id) where base_id is not null;
create index sessions_wants on sessions (wants) where wants is not null;

create view exchange_view as
select id, started_at, user_agent, method, path, model, served_model, stream, status,
       first_token_ms, duration_ms, finish_reason, changes_count, flags, tags, session_id,
       prompt_tokens, completion_tokens, substr(content, 1, 200) as content_start, error, trace_id
from exchanges order by id desc;
"""

DAYS = f"""
create function tapfix_add_day(d date) returns boolean
language plpgsql as $$
declare
    suffix text := to_char(d, 'YYYYMMDD');
    lo timestamptz := d::timestamp at time zone 'UTC';
    hi timestamptz := (d + 1)::timestamp at time zone 'UTC';
    t text;
    part text;
    made boolean := false;
begin
    perform pg_advisory_xact_lock({ADD_DAY_LOCK});
    foreach t in array array['exchanges', 'bodies', 'changes', 'choices'] loop
        part := t || '_' || suffix;
        continue when to_regclass(quote_ident(part)) is not null;
        -- A skewed clock may have put rows of this day in the default partition: they move into the
        -- new day, with writes to the default partition held meanwhile.
        execute format('lock table %I in exclusive mode', t || '_default');
        execute format('create table %I (like %I including defaults including constraints)', part, t);
        if t = 'exchanges' then
            execute format('with moved as (delete from %I where started_at >= $1 and started_at < $2 returning *)'
                           ' insert into %I select * from moved', t || '_default', part) using lo, hi;
            execute format('alter table %I attach partition %I for values from (%L) to (%L)', t, part, lo, hi);
        else
            execute format('with moved as (delete from %I where day = $1 returning *)'
                           ' insert into %I select * from moved', t || '_default', part) using d;
            execute format('alter table %I attach partition %I for values from (%L) to (%L)', t, part, d, d + 1);
        end if;
        made := true;
    end loop;
    return made;
end
$$;

comment on function tapfix_add_day(date) is
    'Make the day partitions of exchanges, bodies, changes and choices for a UTC date (true: made now)';
"""

# `captures tail` on PostgreSQL (store/pg/tail.py): the transaction that wrote a row, and its order in it.
# Added without a default first, so the rows already there are not rewritten (they read as older than any
# tail's start); then the defaults fill every new row at insert, with nothing for the writer to send.
COMMIT_ORDER = """
create sequence exchanges_commit_seq as bigint;
alter table exchanges add column commit_xid xid8, add column commit_seq bigint;
alter table exchanges alter column commit_xid set default pg_current_xact_id(),
    alter column commit_seq set default nextval('exchanges_commit_seq');
alter sequence exchanges_commit_seq owned by exchanges.commit_seq;
create index exchanges_commit_order on exchanges (commit_xid, commit_seq);
"""

# What the browser's filters need besides pg001's `(column, id)` indexes (store/pg/filters.py `where`),
# each the shape of the condition it serves, so a page of "this filter, newest first" walks one index:
# - the client filter is a prefix of the user agent, compared bytewise (`collate "C"`), whatever the
#   database's collation: it replaces pg001's `(user_agent, id)`, which served no query once this exists;
# - `status=error`, `changes=1` (and `repairs=1`, which probes `changes` from there) are partial
#   indexes of the id: few exchanges match, and those are walked newest first;
# - flags and tags are JSON arrays in text: GIN over their jsonb, for `@>`, on the rows that have any;
# - the sessions page lists runs by `last_at, id` newest first.
BROWSE_INDEXES = """
create index exchanges_user_agent_c on exchanges ((user_agent collate "C"), id);
drop index exchanges_user_agent;
create index exchanges_errors on exchanges (id) where status is null or status >= 400 or error is not null;
create index exchanges_changed on exchanges (id) where changes_count > 0;
create index exchanges_flags on exchanges using gin ((flags::jsonb) jsonb_path_ops) where flags <> '[]';
create index exchanges_tags on exchanges using gin ((tags::jsonb) jsonb_path_ops) where tags <> '[]';
create index sessions_last_at on sessions (last_at, id);
"""

# Threads within a session (store/sessions.py; SQLite's m007_threads): the first exchange of the chain.
THREADS = """
alter table exchanges add column thread_id text collate "C";
create index exchanges_thread_id on exchanges (thread_id) where thread_id is not null;
"""

# Where the prompt stopped extending its thread's previous request (SQLite's m008_prefix_break): JSON text.
PREFIX_BREAK = """
alter table exchanges add column prefix_break text;
"""

# Routes (issue 38; SQLite's m009_route_decision): the decision that sent an exchange where it went, as JSON text.
ROUTE_DECISION = """
alter table exchanges add column route_decision text;
"""


# The token-volume report (issue 38; SQLite's m010_route_and_token_details): the route taken, and the cached
# prompt and reasoning tokens from the usage as columns, filled for the rows already stored (the usage is the
# writer's own JSON text; only a whole number is taken). Each path is one store/exchange_row.py reads.
def _first_count(*paths: str) -> str:
    def one(path: str) -> str:  # a JSON whole number (not 5.0, as orjson reads it) that fits an integer
        at, text = f"(usage::jsonb #> '{{{path}}}')", f"(usage::jsonb #>> '{{{path}}}')"
        digits = f"jsonb_typeof({at}) = 'number' and {text} ~ '^[0-9]{{1,10}}$'"
        return f"case when {digits} then case when {text}::bigint <= 2147483647 then {text}::integer end end"

    return "coalesce(" + ", ".join(one(p) for p in paths) + ")"


_CACHED = _first_count(
    "prompt_tokens_details,cached_tokens", "input_tokens_details,cached_tokens", "cache_read_input_tokens"
)
_REASONING = _first_count("completion_tokens_details,reasoning_tokens", "output_tokens_details,reasoning_tokens")
ROUTE_AND_TOKEN_DETAILS = f"""
alter table exchanges add column route text collate "C",
    add column cached_tokens integer, add column reasoning_tokens integer;
create index exchanges_route on exchanges (route, id) where route is not null;
update exchanges set cached_tokens = {_CACHED}, reasoning_tokens = {_REASONING}
where usage is not null and usage like '{{%';
"""

# Named, ordered; applied in one transaction by store/pg/migrate.py. Never edit a shipped one: add one.
MIGRATIONS: tuple[tuple[str, str], ...] = (
    ("pg001_tables", TABLES),
    ("pg002_day_partitions", DAYS),
    ("pg003_body_functions", FUNCTIONS + EXCHANGE_BODIES),
    ("pg004_commit_order", COMMIT_ORDER),
    ("pg005_browse_indexes", BROWSE_INDEXES),
    ("pg006_threads", THREADS),
    ("pg007_prefix_break", PREFIX_BREAK),
    ("pg008_route_decision", ROUTE_DECISION),
    ("pg009_route_and_token_details", ROUTE_AND_TOKEN_DETAILS),
)

# The SQLite migration (store/sqlite/schema.py) whose schema each of these reaches: how `captures copy` tells
# whether two stores of different backends are at the same version. Every migration added above gets one.
REACHES: dict[str, str] = {
    "pg001_tables": "m005_trace_context",
    "pg002_day_partitions": "m005_trace_context",
    "pg003_body_functions": "m006_exchange_bodies",
    "pg004_commit_order": "m006_exchange_bodies",  # PostgreSQL's own columns (`captures tail`): no SQLite step
    "pg005_browse_indexes": "m006_exchange_bodies",  # indexes only (the browser's filters): no SQLite step
    "pg006_threads": "m007_threads",
    "pg007_prefix_break": "m008_prefix_break",
    "pg008_route_decision": "m009_route_decision",
    "pg009_route_and_token_details": "m010_route_and_token_details",
}
