"""The PostgreSQL migration set on a real server (tests/support/postgres.py): applied once however often
it runs, the same tables, columns and views as SQLite's migrations reach, day partitions, and
`tapfix_body` / `tapfix_body_bytes` rebuilding delta chains byte for byte like the Python reader."""

from __future__ import annotations

import datetime
import sqlite3
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from tapfix.proxy.store.bodies import BODY_KINDS
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.pg.migrate import add_days, applied, migrate
from tapfix.proxy.store.pg.schema import MIGRATIONS
from tapfix.proxy.store.sql_functions import register
from tapfix.proxy.store.sqlite.bodies import BodyReader
from tapfix.proxy.store.sqlite.database import open_for_writing

from tests.support.postgres import PostgresServer
from tests.support.sql_store import Filled, fill_store

pytestmark = [pytest.mark.postgres]

TABLES = ("exchanges", "changes", "bodies", "choices", "sessions")
VIEWS = ("exchange_view", "exchange_bodies")
# Columns only PostgreSQL has, and why (store/pg/schema.py): the day partition key, search, and the
# commit order `captures tail` follows (SQLite's is its rowid).
PG_ONLY = {
    "exchanges": ["search_text", "search", "commit_xid", "commit_seq"],
    "bodies": ["day"],
    "changes": ["day"],
    "choices": ["day"],
}
DAY = datetime.date(2026, 1, 15)  # every copied row's day: a delta never crosses one


@pytest.fixture(scope="module")
def pg(postgres: PostgresServer) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(postgres.create_database("schema"), autocommit=True) as conn:
        migrate(conn)
        yield conn


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Filled:
    return fill_store(tmp_path_factory.mktemp("pg") / "tapfix.db")


def _pg_columns(conn: psycopg.Connection[tuple[object, ...]], table: str) -> list[str]:
    rows = conn.execute(
        "select column_name from information_schema.columns where table_schema = current_schema()"
        " and table_name = %s order by ordinal_position",
        (table,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def _sqlite_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(r[1]) for r in conn.execute(f"pragma table_info({table})")]


def test_migrations_apply_once_and_reach_sqlites_schema(
    pg: psycopg.Connection[tuple[object, ...]], postgres: PostgresServer, tmp_path: Path
) -> None:
    assert applied(pg) == [name for name, _ in MIGRATIONS]
    assert migrate(pg) == [] and migrate(pg) == []  # idempotent: nothing pending, nothing changed
    assert applied(pg) == [name for name, _ in MIGRATIONS]
    lite = open_for_writing(tmp_path / "schema.db")
    for name in TABLES + VIEWS:
        expected = _sqlite_columns(lite, name) + PG_ONLY.get(name, [])
        assert sorted(_pg_columns(pg, name)) == sorted(expected), name
    for name in VIEWS:  # views: the same columns in the same order
        assert _pg_columns(pg, name) == _sqlite_columns(lite, name)
    lite.close()
    # A migration this tapfix doesn't know: a newer tapfix's database, refused by name, left as it is.
    with psycopg.connect(postgres.create_database("newer"), autocommit=True) as other:
        migrate(other)
        other.execute("insert into tapfix_migrations (name, applied_order) values ('pg999_future', 999)")
        with pytest.raises(StoreError, match="pg999_future is unknown"):
            migrate(other, "postgresql://postgres:***@127.0.0.1/newer")
        assert applied(other)[-1] == "pg999_future"


def test_day_partitions_and_the_default_partition(pg: psycopg.Connection[tuple[object, ...]]) -> None:
    """Rows of a day nobody made land in the default partition; making the day moves them into it.
    Look-ups by id and id prefix use the primary key's index."""
    day = datetime.date(2026, 3, 1)
    at = datetime.datetime(2026, 3, 1, 23, 59, 59, tzinfo=datetime.UTC)
    pg.execute("insert into exchanges (id, ts, started_at) values ('skewed00000001', %s, %s)", (at.timestamp(), at))
    pg.execute(
        "insert into bodies (sha256, size, prefix_len, suffix_len, data, depth, day) values ('s', 1, 0, 0, 'x', 0, %s)",
        (day,),
    )

    def home(table: str, where: str) -> str:
        return str(pg.execute(f"select tableoid::regclass::text from {table} where {where}").fetchone()[0])  # type: ignore[index]

    assert home("exchanges", "id = 'skewed00000001'") == "exchanges_default"
    assert add_days(pg, at.timestamp(), ahead=1) == [day, day + datetime.timedelta(days=1)]
    assert add_days(pg, at.timestamp(), ahead=1) == []  # already there
    assert home("exchanges", "id = 'skewed00000001'") == "exchanges_20260301"
    assert home("bodies", "sha256 = 's'") == "bodies_20260301"
    parts = {
        str(r[0])
        for r in pg.execute("select inhrelid::regclass::text from pg_inherits where inhparent = 'choices'::regclass")
    }
    assert {"choices_default", "choices_20260301", "choices_20260302"} <= parts
    with pg.transaction():
        pg.execute("set local enable_seqscan = off")
        for where in ("id = 'skewed00000001'", "id like 'skewed%'"):
            plan = "\n".join(str(r[0]) for r in pg.execute(f"explain select id from exchanges where {where}"))
            scans, conditions = (
                plan.count(" Scan "),
                plan.count("Index Cond: (id =") + plan.count("Index Cond: ((id >="),
            )
            assert "Seq Scan" not in plan and scans == conditions == 3, plan  # each partition: an index range on id
    pg.execute("delete from exchanges where id = 'skewed00000001'")
    pg.execute("delete from bodies where sha256 = 's'")


def _copy(lite: sqlite3.Connection, pg: psycopg.Connection[tuple[object, ...]]) -> None:
    """Every exchange and body of the SQLite store into PostgreSQL as it would be stored there: the same
    ids and delta rows, each middle inflated (raw), all in one day."""
    add_days(pg, datetime.datetime(DAY.year, DAY.month, DAY.day, tzinfo=datetime.UTC).timestamp(), ahead=0)
    with pg.transaction():
        for row in lite.execute(
            "select id, sha256, size, base_id, prefix_len, suffix_len, encoding, data, depth from bodies"
        ):
            middle = zlib.decompress(row[7]) if row[6] == "zlib" else bytes(row[7])
            pg.execute(
                "insert into bodies (id, sha256, size, base_id, prefix_len, suffix_len, data, depth, day)"
                " values (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (*row[:6], middle, row[8], DAY),
            )
        noon = datetime.datetime(DAY.year, DAY.month, DAY.day, 12, tzinfo=datetime.UTC)
        for n, row in enumerate(
            lite.execute(
                "select id, ts, request_body_id, forwarded_body_id, response_body_id, client_response_body_id,"
                " method, path, model, status, session_id from exchanges order by id"
            )
        ):
            pg.execute(
                "insert into exchanges (id, ts, started_at, request_body_id, forwarded_body_id, response_body_id,"
                " client_response_body_id, method, path, model, status, session_id)"
                " values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (row[0], row[1], noon + datetime.timedelta(milliseconds=n), *row[2:]),
            )
        pg.execute("select setval('bodies_id_seq', (select max(id) from bodies))")


def test_tapfix_body_is_sqlites_byte_for_byte(pg: psycopg.Connection[tuple[object, ...]], filled: Filled) -> None:
    """Every kind of every exchange of a store the real writer filled (a delta session past one chain's
    depth, changed requests, repaired answers, a non-UTF-8 body, `--no-bodies`): PostgreSQL's
    functions give what the Python reader gives; text where SQLite's gives text, NULL where it gives a BLOB."""
    lite = sqlite3.connect(filled.path)
    register(lite)
    _copy(lite, pg)
    depths = [int(r[0]) for r in lite.execute("select depth from bodies")]
    assert max(depths) >= 40 and depths.count(0) >= 2  # long chains, and a restart
    reader = BodyReader(lite)
    compared = 0
    for (exchange_id,) in lite.execute("select id from exchanges").fetchall():
        for kind in BODY_KINDS:
            expected = lite.execute(
                "select tapfix_body(?, ?), tapfix_body_bytes(?, ?)", (exchange_id, kind) * 2
            ).fetchone()
            got = pg.execute(
                "select tapfix_body(%s, %s), tapfix_body_bytes(%s, %s)", (exchange_id, kind) * 2
            ).fetchone()
            assert got is not None
            assert got[1] == expected[1], (exchange_id, kind)
            assert got[0] == (expected[0] if isinstance(expected[0], str) else None), (exchange_id, kind)
            compared += got[1] is not None
    assert compared > 100
    binary = filled.ids["binary"]
    row = pg.execute(
        "select tapfix_body(%s, 'response'), tapfix_body_bytes(%s, 'response')", (binary, binary)
    ).fetchone()
    assert row is not None and row[0] is None and row[1] == filled.bodies[binary]["response"]
    ids = lite.execute("select request_body_id from exchanges where request_body_id is not null").fetchall()
    assert all(
        pg.execute("select tapfix_body_rebuild(%s, %s)", (i, DAY)).fetchone()[0] == reader.read(i)  # type: ignore[index]
        for (i,) in ids
    )
    view = pg.execute("select count(*), count(request) from exchange_bodies").fetchone()
    assert view is not None and view[0] == len(filled.bodies) and view[1] > 0
    lite.close()


def test_hand_made_chains_errors_and_edge_cases(pg: psycopg.Connection[tuple[object, ...]], tmp_path: Path) -> None:
    """Rows written by hand, the same in a SQLite store and in PostgreSQL: a chain whose prefix and suffix
    ask for more than the base has (clamped, never overlapping), a NUL byte (text can't hold it), and
    damaged chains, which raise naming the body; an unknown kind raises listing the four."""
    lite = open_for_writing(tmp_path / "hand.db")
    root = b'{"messages":[{"role":"user","content":"hello"}]}'
    rows = [  # id, base_id, prefix, suffix, middle, size
        (900001, None, 0, 0, root, len(root)),
        (900002, 900001, len(root) - 2, 2, b',{"role":"assistant","content":"hi \xc3\xa9"}', 0),
        (900003, 900002, 10_000, 10_000, b"", 0),  # asks for more than the base: the base, whole
        (900004, 900003, 5, 3, b"\x00\xff", 0),
    ]
    built: dict[int, bytes] = {}
    for body_id, base, prefix, suffix, middle, _ in rows:
        data = middle if base is None else _rebuilt(built[base], prefix, suffix, middle)
        built[body_id] = data
        for sql, conn in (("?", lite), ("%s", pg)):
            values = (body_id, f"h{body_id}", len(data), base, prefix, suffix, "raw", middle, 0)
            cols = "id, sha256, size, base_id, prefix_len, suffix_len, encoding, data, depth"
            if conn is pg:
                pg.execute(f"insert into bodies ({cols}, day) values ({', '.join([sql] * 10)})", (*values, DAY))
            else:
                lite.execute(f"insert into bodies ({cols}) values ({', '.join([sql] * 9)})", values)
    reader = BodyReader(lite)
    for body_id, data in built.items():
        assert reader.read(body_id) == data
        assert pg.execute("select tapfix_body_rebuild(%s, %s)", (body_id, DAY)).fetchone() == (data,)  # type: ignore[comparison-overlap]
    noon = datetime.datetime(DAY.year, DAY.month, DAY.day, 12, tzinfo=datetime.UTC)
    pg.execute(
        "insert into exchanges (id, ts, started_at, request_body_id, response_body_id)"
        " values ('hand0000000001', 0, %s, 900003, 900004)",
        (noon,),
    )
    got = pg.execute(
        "select tapfix_body('hand0000000001', 'forwarded'), tapfix_body('hand0000000001', 'client_response'),"
        " tapfix_body_bytes('hand0000000001', 'client_response')"
    ).fetchone()
    assert got == (built[900003].decode(), None, built[900004])
    assert pg.execute("select tapfix_body('nosuchid', 'request'), tapfix_body(null, 'request')").fetchone() == (
        None,
        None,
    )
    with pytest.raises(
        psycopg.errors.RaiseException,
        match="unknown kind 'body': use one of request, forwarded, response, client_response",
    ):
        pg.execute("select tapfix_body('hand0000000001', 'body')")
    with pytest.raises(psycopg.errors.RaiseException, match="unknown kind NULL"):
        pg.execute("select tapfix_body_bytes('hand0000000001', null)")
    pg.execute("update bodies set size = size + 1 where id = 900002")
    with pytest.raises(psycopg.errors.RaiseException, match="body 900002: rebuilt to"):
        pg.execute("select tapfix_body_bytes('hand0000000001', 'request')")
    pg.execute("delete from bodies where id = 900001")
    with pytest.raises(psycopg.errors.RaiseException, match="body 900001 is missing from the store"):
        pg.execute("select tapfix_body_bytes('hand0000000001', 'request')")
    pg.execute("update bodies set base_id = 900003 where id = 900002")  # a cycle
    with pytest.raises(psycopg.errors.RaiseException, match="delta chain longer than"):
        pg.execute("select tapfix_body_bytes('hand0000000001', 'request')")
    lite.close()


def _rebuilt(base: bytes, prefix: int, suffix: int, middle: bytes) -> bytes:
    """A delta's body from its base, with BodyReader's clamping (written out here on purpose: the
    expectation must not come from either decoder)."""
    head = min(prefix, len(base))
    tail = max(0, min(suffix, len(base) - head))
    return base[:head] + middle + base[len(base) - tail :]


def test_instances_starting_together_migrate_once(postgres: PostgresServer) -> None:
    """Several tapfix instances starting at once against one new database: one migrates, the others
    wait on the lock and find nothing pending; nobody fails."""
    dsn = postgres.create_database("together")
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                results.append(migrate(conn))
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and sorted(results, key=len) == [[], [], [], [name for name, _ in MIGRATIONS]]


def test_search_columns_find_words_and_substrings(pg: psycopg.Connection[tuple[object, ...]]) -> None:
    """What the writer will fill: words through the tsvector (simple configuration: no stemming), and
    substrings, CJK included, through pg_trgm, both served by their GIN indexes."""
    noon = datetime.datetime(DAY.year, DAY.month, DAY.day, 12, tzinfo=datetime.UTC)
    add_days(pg, noon.timestamp(), ahead=0)
    texts = {"srch0000000001": "Refactor the parser_state module", "srch0000000002": "修复数据库连接的错误 please"}
    for exchange_id, text in texts.items():
        pg.execute(
            "insert into exchanges (id, ts, started_at, search_text, search)"
            " values (%s, 0, %s, %s, to_tsvector('simple', %s))",
            (exchange_id, noon, text, text),
        )

    def found(where: str, arg: str) -> list[str]:
        return [str(r[0]) for r in pg.execute(f"select id from exchanges where {where} order by id", (arg,))]

    assert found("search @@ plainto_tsquery('simple', %s)", "refactor") == ["srch0000000001"]
    assert found("search @@ plainto_tsquery('simple', %s)", "refactored") == []  # no stemming
    assert found("search_text ilike '%%' || %s || '%%'", "ser_sta") == ["srch0000000001"]
    assert found("search_text ilike '%%' || %s || '%%'", "数据库") == ["srch0000000002"]
    with pg.transaction():
        pg.execute("set local enable_seqscan = off")
        plan = "\n".join(
            str(r[0]) for r in pg.execute("explain select id from exchanges where search_text ilike '%数据库%'")
        )
        assert "exchanges_20260115_search_text_idx" in plan, plan
        plan = "\n".join(
            str(r[0]) for r in pg.execute("explain select id from exchanges where search @@ 'refactor'::tsquery")
        )
        assert "exchanges_20260115_search_idx" in plan, plan
    pg.execute("delete from exchanges where id like 'srch%'")
