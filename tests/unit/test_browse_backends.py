"""The browser on both backends (store/backend.py `BrowseQueries`): the same exchanges, written by each
backend's real writer, give the same pages: the list with every filter of the form, keyset pagination
both ways, id prefixes, search (words, "phrases", prefixes), sessions, the capture page and its exact
bodies, the stats page. PostgreSQL's search also finds part of a word and CJK text without spaces
(pg_trgm); EXPLAIN shows its filters served by the indexes of pg001/pg005."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from starlette.testclient import TestClient
from tapfix.proxy.browse import create_app
from tapfix.proxy.browse.session_turns import session_view
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.ids import new_capture_id
from tapfix.proxy.store.filters import Filters
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.parts import BrowseQueries

from tests.support.builders import chat_chunk, sse_events
from tests.support.stores import BACKENDS, Backend, make_backend
from tests.unit.test_browse_app import ids_on
from tests.unit.test_browse_fixtures import OPENCODE, SDK, _exchange, body, browse_exchanges

CJK = "東京都の天気予報を調べて"


@functools.cache
def exchanges() -> dict[str, Exchange]:
    """test_browse_fixtures' exchanges, and a CJK turn (no spaces: one FTS5 token, many trigrams), each
    with the id a proxy gives at arrival: SQLite lists in write order, PostgreSQL by id (source.py)."""
    named = browse_exchanges()
    last = max(ex.started_at for ex in named.values())
    named["cjk"] = _exchange(
        last + 10,
        request=body([{"role": "user", "content": CJK}]),
        response_chunks=sse_events([chat_chunk({"content": "晴れのち曇り"}), chat_chunk({}, "stop")]),
        chunk_times=[0.1, 0.2, 0.21],
    )
    for ex in named.values():
        ex.id = new_capture_id(ex.started_at)
    named["replay"].source_id = named["sdk"].id
    return named


@dataclass
class Site:
    backend: Backend
    client: TestClient
    store: BrowseQueries
    ids: dict[str, str]

    def ids_of(self, query: str = "", path: str = "/") -> list[str]:
        r = self.client.get(f"{path}?{query}")
        assert r.status_code == 200, r.text
        names = {v: k for k, v in self.ids.items()}
        return [names[i] for i in ids_on(r.text)]


@pytest.fixture(scope="module", params=BACKENDS)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    backend = make_backend(request, tmp_path_factory.mktemp(request.param))
    writer = backend.writer()
    for ex in exchanges().values():
        writer.submit(ex)
    writer.close()
    app = create_app(StoreLocator.resolve(backend.locator, postgres=True), background_index=False)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        app.state.store.catch_up()
        yield Site(backend, client, app.state.store, {k: ex.id for k, ex in exchanges().items()})


NEWEST_FIRST = ["cjk", "xss", "error", "replay", "sdk", "turn3", "turn2", "turn1"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", NEWEST_FIRST),
        ("model=llama-3.1-8b", ["error", "replay", "sdk"]),
        ("client=opencode", ["cjk", "turn3", "turn2", "turn1"]),
        (f"client={SDK.replace(' ', '+')}", ["error", "sdk"]),
        ("path=/v1/chat/completions&model=qwen3", ["cjk", "xss", "turn3", "turn2", "turn1"]),
        ("path=/v1/embeddings", []),
        ("status=502", ["error"]),
        ("status=5xx", ["error"]),
        ("status=error", ["error"]),
        ("status=2xx&model=llama-3.1-8b", ["replay", "sdk"]),
        ("changes=1", ["xss", "turn2", "turn1"]),
        ("repairs=1", ["xss", "turn2"]),
        ("flag=runaway_length", ["turn3"]),
        ("flag=no_sampling_params", ["turn1"]),
        ("tag=replay", ["replay"]),
        ("session=ses_opencode_1", ["turn3", "turn2", "turn1"]),
        ("since=1d", NEWEST_FIRST),
        ("until=2000-01-01", []),
        ("since=2000-01-01T00:00&until=2100-01-01", NEWEST_FIRST),
        ("q=tokenizer", ["turn2"]),  # asked in turn 2 only
        ("q=Canberra", ["replay", "sdk"]),  # in the answer
        ("q=tokeni*", ["turn3", "turn2"]),
        ('q="read+tokenizer.py"', ["turn2"]),
        ("q=canberra&tag=replay", ["replay"]),
        ("q=nothing-like-this", []),
        ("q=flaky", ["turn1"]),  # the opening message is resent by turns 2 and 3, indexed for turn 1 only
    ],
)
def test_list_filters_and_search(site: Site, query: str, expected: list[str]) -> None:
    assert site.ids_of(query) == expected


def test_pagination_both_ways_and_prefixes(site: Site) -> None:
    first = site.store.list_exchanges(Filters(), limit=3)
    assert [r["id"] for r in first.rows] == [site.ids[k] for k in NEWEST_FIRST[:3]] and first.newer is None
    second = site.store.list_exchanges(Filters(), before=first.older or "", limit=3)
    assert [r["id"] for r in second.rows] == [site.ids[k] for k in NEWEST_FIRST[3:6]]
    back = site.store.list_exchanges(Filters(), after=second.newer or "", limit=3)
    assert back.rows == first.rows and back.newer is None and back.older == first.older
    last = site.store.list_exchanges(Filters(model="qwen3"), before=site.ids["turn3"], limit=3)
    assert [r["id"] for r in last.rows] == [site.ids["turn2"], site.ids["turn1"]] and last.older is None
    html = site.client.get(f"/?before={site.ids['sdk']}&model=qwen3").text
    assert f"after={site.ids['turn3']}" in html and "model=qwen3" in html
    r = site.client.get(f"/exchange/{site.ids['sdk'][:14]}", follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == f"/exchange/{site.ids['sdk']}"
    assert site.client.get("/exchange/zzzzzzzz").status_code == 404


def test_search_marks_matches_and_postgresql_finds_substrings(site: Site) -> None:
    page = site.client.get("/?q=zebra").text
    assert ids_on(page) == [site.ids["error"]] and "<mark>zebra</mark>" in page
    for q in ['"', "AND OR NOT", "a:b", "(", "*", "NEAR(", "'; drop table exchanges; --", "100%_\\"]:
        assert site.client.get("/", params={"q": q}).status_code == 200
    if site.backend.name == "postgresql":  # FTS5 matches whole tokens only
        assert site.ids_of("q=okeniz") == ["turn3", "turn2"]
        assert site.ids_of("q=天気予報") == ["cjk"] and site.ids_of("q=曇り") == ["cjk"]
        assert "<mark>天気予報</mark>" in site.client.get("/?q=天気予報").text


def test_capture_page_and_exact_bodies(site: Site) -> None:
    html = site.client.get(f"/exchange/{site.ids['turn1']}").text
    assert "changes (2)" in html and "sampling: added $.temperature = 0.6 (the client sent none)" in html
    assert '<span class="add">+  &#34;temperature&#34;: 0.6,</span>' in html
    assert f"tapfix replay {site.ids['turn1']} --db " in html and "next turn" in html
    assert "sk-very-secret-key" not in html and (site.backend.name != "postgresql" or ":***@" in html)
    html = site.client.get(f"/exchange/{site.ids['turn2']}").text
    assert "repaired tool calls" in html and "two JSON objects glued together" in html
    html = site.client.get(f"/exchange/{site.ids['turn3']}").text
    assert html.count('<rect class="stall"') == 1 and "TTFT 300 ms" in html and "decode 12.1 tokens/s" in html
    html = site.client.get(f"/exchange/{site.ids['sdk']}").text
    assert "replays (1)" in html and f'href="/exchange/{site.ids["replay"]}"' in html
    for name in ("turn1", "turn3", "sdk", "cjk"):
        ex = exchanges()[name]
        sent = {"request": ex.request, "forwarded": ex.forwarded or ex.request, "response": ex.response_body()}
        for which, data in sent.items():
            r = site.client.get(f"/exchange/{ex.id}/body/{which}")
            assert r.status_code == 200 and r.content == data, (name, which)
    bundle = site.client.get(f"/exchange/{site.ids['sdk']}/bundle")
    assert bundle.status_code == 200 and bundle.headers["content-disposition"].startswith("attachment;")


def test_sessions_and_session_pages(site: Site) -> None:
    html = site.client.get("/sessions").text
    row = re.search(r"ses_opencode_1</a>.*?</tr>", html, re.S)
    assert row and '<td class="num">3</td>' in row.group(0) and "480→63" in row.group(0)
    assert OPENCODE.split()[0] in html
    assert site.ids_of(path="/session/ses_opencode_1") == ["turn1", "turn2", "turn3"]
    html = site.client.get("/session/ses_opencode_1").text
    assert "2 messages resent unchanged, 2 new" in html and "4 messages resent unchanged, 2 new" in html
    assert "Go ahead, read tokenizer.py first" in html and "1 repair" in html and "160→14 tokens" in html
    stored = site.store.load_session("ses_opencode_1", limit=2)
    assert stored is not None
    first = session_view(stored)
    assert [t.number for t in first.turns] == [1, 2] and first.later
    stored = site.store.load_session("ses_opencode_1", after=str(first.later), limit=2)
    assert stored is not None
    rest = session_view(stored)
    assert [t.number for t in rest.turns] == [3] and rest.later is None
    assert rest.turns[0].delta is not None and rest.turns[0].delta.kept == 4  # compared with turn 2's body
    assert site.client.get("/session/no-such-session").status_code == 404


def test_stats_and_facets(site: Site) -> None:
    html = site.client.get("/stats").text
    assert "8 requests" in html and "llama-3.1-8b" in html
    assert re.search(r'href="/\?flag=no_sampling_params">1</a> flagged', html)
    assert "5 requests" in site.client.get("/stats?model=qwen3").text
    facets = site.store.facets()
    assert sorted(facets["models"]) == [("llama-3.1-8b", 3), ("qwen3", 5)]
    assert dict(facets["flags"])["runaway_length"] == 1


@pytest.mark.parametrize("site", BACKENDS[1:], indirect=True)
def test_postgresql_filters_are_served_by_indexes(site: Site) -> None:
    """The plan of each filter's page names the index meant for it (pg001, pg005): the conditions
    the browser sends have the shapes those indexes serve. Sequential scans are off so the planner
    shows what it can use on a table this small (and for GIN, the walk of the primary key too: on a
    few rows, reading them all beats a bitmap)."""
    import psycopg
    from tapfix.proxy.store.filters import search_terms
    from tapfix.proxy.store.pg.browse import LIST_COLUMNS, search_where
    from tapfix.proxy.store.pg.filters import where
    from tapfix.proxy.store.pg.reader import pyformat

    expected = {
        "model": (Filters(model="qwen3"), "exchanges_model"),
        "client": (Filters(client="opencode"), "exchanges_user_agent_c"),
        "session": (Filters(session="ses_opencode_1"), "exchanges_session_id"),
        "error": (Filters(status="error"), "exchanges_errors"),
        "changes": (Filters(changes="1"), "exchanges_changed"),
        "flag": (Filters(flag="runaway_length"), "exchanges_flags"),
        "tag": (Filters(tag="replay"), "exchanges_tags"),
        "since": (Filters(since="1h"), "exchanges_started_at"),
        "words": (Filters(q="tokenizer"), "exchanges_search"),
        "substring": (Filters(q="天気予報"), "exchanges_search_text"),
    }
    with psycopg.connect(site.backend.locator, autocommit=True) as conn:
        conn.execute("analyze")
        conn.execute("set enable_seqscan = off")
        parents = conn.execute(  # a day partition's index → the index of exchanges it belongs to
            b"select c.relname, p.relname from pg_inherits i join pg_class c on c.oid = i.inhrelid"
            b" join pg_class p on p.oid = i.inhparent where p.relkind = 'I'"
        ).fetchall()
        for name, (f, index) in expected.items():
            gin = index in ("exchanges_flags", "exchanges_tags", "exchanges_search", "exchanges_search_text")
            conn.execute(f"set enable_indexscan = {'off' if gin else 'on'}".encode())  # GIN: bitmap scans only
            clauses, args = where(f)
            found, found_args = search_where(search_terms(f.q))
            sql = f"explain select {LIST_COLUMNS} from exchanges e where {' and '.join([*found, *clauses])}"
            plan = "\n".join(
                r[0] for r in conn.execute(pyformat(f"{sql} order by e.id desc limit 51"), [*found_args, *args])
            )
            used = {parent for part, parent in parents if f" {part} " in plan}
            assert index in used, (name, plan)
        conn.execute(b"set enable_indexscan = on")
        prefix = conn.execute(  # what resolving an id prefix sends (store/pg/reader.py)
            b"explain select id from exchanges where id >= %s and id < %s order by id limit 3", ("01", "01\uffff")
        ).fetchall()
        plan = "\n".join(r[0] for r in prefix)
        assert "exchanges_pkey" in {parent for part, parent in parents if f" {part} " in plan}, plan
