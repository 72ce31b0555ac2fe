"""Bodies on PostgreSQL: the same prefix/suffix deltas as SQLite (store/bodies.py), with raw middles.

Why raw: on SQLite a delta's middle is zlib-compressed (`encoding` "zlib") and Python inflates it. On
PostgreSQL `tapfix_body()` rebuilds bodies inside the server, in PL/pgSQL, which has no inflate; so
every middle is stored as it is (`encoding` is always "raw", a check constraint holds it), and
PostgreSQL's TOAST compresses what is large (a whole first body, a long tool result: values over
~2 kB). The middles of later turns are small (a turn's new messages), so little is lost to zlib.

The layout of a row, as on SQLite: a root (`base_id` null) holds the whole body; a delta holds the
middle, and the body is the base's first `prefix_len` bytes, the middle, then the base's last
`suffix_len` bytes (each clamped to what the base has, never overlapping, exactly as `BodyReader`
does). `size` and `sha256` describe the rebuilt body; chains are at most `MAX_DEPTH` deep.

Partitions: `bodies` is partitioned by `day` (the UTC date of the exchange it was written for), like
`exchanges`, `changes` and `choices`, so age retention drops a day of bodies with its exchanges. A
delta never crosses a day: a session's first body of a new day is stored whole, and the decoder
looks a base up in its delta's own day only (a base elsewhere reads as missing). Identical bodies
are stored once per day (`unique (day, sha256)`).

`tapfix_body(exchange_id, kind)` returns text: PostgreSQL's text can hold neither invalid UTF-8 nor
a NUL byte, so where SQLite's returns a BLOB (a compressed or binary body) this one returns NULL;
`tapfix_body_bytes()` always returns the exact bytes (bytea). A binary body is therefore
`tapfix_body(...) is null and tapfix_body_bytes(...) is not null`. The database must be UTF8 (the
first migration checks). An unknown kind raises, listing the four kinds; an unknown exchange id,
or bodies not stored (`--no-bodies`), is NULL; a damaged chain (a missing base, a cycle, a wrong
size) raises naming the body.
"""

from __future__ import annotations

from tapfix.proxy.store.bodies import BODY_KINDS, MAX_DEPTH

_KINDS = ", ".join(BODY_KINDS)

FUNCTIONS = f"""
create function tapfix_body_rebuild(p_body_id bigint, p_day date) returns bytea
language plpgsql stable as $$
declare
    r record;
    result bytea := ''::bytea;
    have integer;
    head integer;
    tail integer;
    steps integer := 0;
begin
    if p_body_id is null then
        return null;
    end if;
    for r in
        with recursive chain (id, base_id, prefix_len, suffix_len, encoding, data, size, n) as (
            select b.id, b.base_id, b.prefix_len, b.suffix_len, b.encoding, b.data, b.size, 0
            from bodies b where b.id = p_body_id and b.day = p_day
            union all
            select b.id, b.base_id, b.prefix_len, b.suffix_len, b.encoding, b.data, b.size, c.n + 1
            from chain c join bodies b on b.id = c.base_id and b.day = p_day
            where c.n <= {MAX_DEPTH}
        )
        select * from chain order by n desc
    loop
        steps := steps + 1;
        if steps = 1 and r.n > {MAX_DEPTH} then
            raise exception 'body %: delta chain longer than {MAX_DEPTH + 1} (damaged store)', p_body_id;
        end if;
        if steps = 1 and r.base_id is not null then
            raise exception 'body % is missing from the store (the base of body %)', r.base_id, r.id;
        end if;
        if r.encoding <> 'raw' then
            raise exception 'body %: encoding % is not one PostgreSQL stores (only raw)', r.id, r.encoding;
        end if;
        if r.base_id is null then
            result := r.data;
        else
            have := length(result);
            head := least(r.prefix_len, have);
            tail := greatest(0, least(r.suffix_len, have - head));
            result := substring(result from 1 for head) || r.data || substring(result from have - tail + 1 for tail);
        end if;
        if length(result) <> r.size then
            raise exception 'body %: rebuilt to % bytes, expected %', r.id, length(result), r.size;
        end if;
    end loop;
    if steps = 0 then
        raise exception 'body % is missing from the store', p_body_id;
    end if;
    return result;
end
$$;

create function tapfix_body_bytes(exchange_id text, kind text) returns bytea
language plpgsql stable as $$
declare
    e record;
    body_id bigint;
begin
    if kind is null or kind not in ('request', 'forwarded', 'response', 'client_response') then
        raise exception 'tapfix_body: unknown kind %: use one of {_KINDS}', coalesce(quote_literal(kind), 'NULL');
    end if;
    if exchange_id is null then
        return null;
    end if;
    select x.request_body_id, x.forwarded_body_id, x.response_body_id, x.client_response_body_id,
           (x.started_at at time zone 'UTC')::date as day
        into e from exchanges x where x.id = tapfix_body_bytes.exchange_id;
    if not found then
        return null;
    end if;
    body_id := case kind
        when 'request' then e.request_body_id
        when 'forwarded' then coalesce(e.forwarded_body_id, e.request_body_id)
        when 'response' then e.response_body_id
        else coalesce(e.client_response_body_id, e.response_body_id)
    end;
    return tapfix_body_rebuild(body_id, e.day);
end
$$;

create function tapfix_body(exchange_id text, kind text) returns text
language plpgsql stable as $$
declare
    data bytea := tapfix_body_bytes(exchange_id, kind);
begin
    if data is null or position('\\x00'::bytea in data) > 0 then
        return null;
    end if;
    return convert_from(data, 'UTF8');
exception when character_not_in_repertoire or untranslatable_character then
    return null;  -- not valid UTF-8: tapfix_body_bytes() has the bytes
end
$$;

comment on function tapfix_body(text, text) is
    'A capture''s body as text (kind: {_KINDS}); NULL when it is not valid UTF-8: use tapfix_body_bytes()';
comment on function tapfix_body_bytes(text, text) is
    'A capture''s body, the exact bytes (kind: {_KINDS})';
"""

# What SQLite's m006 made, over the functions above.
EXCHANGE_BODIES = """
create view exchange_bodies as
select id, started_at, method, path, model, status, session_id,
       tapfix_body(id, 'request') as request,
       tapfix_body(id, 'response') as response,
       case when forwarded_body_id is not null then tapfix_body(id, 'forwarded') end as forwarded,
       case when client_response_body_id is not null then tapfix_body(id, 'client_response') end
           as client_response
from exchanges
"""
