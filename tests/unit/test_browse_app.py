"""Every route and filter of `tapfix browse`, through TestClient over a db written by CaptureWriter."""

from __future__ import annotations

import io
import re
import sqlite3
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from tapfix.proxy.browse import create_app
from tapfix.proxy.browse.detail import export_available
from tapfix.proxy.store.locator import StoreLocator

from tests.unit.test_browse_fixtures import OPENCODE, Built, build_db
from tests.unit.test_store_attempts import as_before_attempts, regenerated
from tests.unit.test_store_attempts import exchange as attempt_exchange
from tests.unit.test_store_attempts import write as write_exchanges


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_db(tmp_path_factory.mktemp("browse") / "captures.db")


@pytest.fixture(scope="module")
def client(built: Built) -> Iterator[TestClient]:
    app = create_app(built.path, background_index=False)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c


def ids_on(html: str) -> list[str]:
    return re.findall(r'<a class="id" href="/exchange/([0-9a-z]+)">', html)


def test_list_newest_first(client: TestClient, built: Built) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert ids_on(r.text) == [built.ids[k] for k in ("xss", "error", "replay", "sdk", "turn3", "turn2", "turn1")]


# Every filter of the list (the form's, and search) is checked on both backends, SQLite always, in
# tests/unit/test_browse_backends.py's test_list_filters_and_search.


def test_time_range_splits_the_session(client: TestClient, built: Built) -> None:
    conn = sqlite3.connect(built.path)
    ts = conn.execute("select ts from exchanges where id = ?", (built.ids["turn2"],)).fetchone()[0]
    r = client.get("/", params={"since": _iso(ts - 0.001), "until": _iso(ts + 8)})
    assert ids_on(r.text) == [built.ids["turn3"], built.ids["turn2"]]


def _iso(ts: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat()


@pytest.mark.parametrize("query", ["status=abc", "since=yesterday-ish"])
def test_bad_filter_is_a_message_not_a_crash(client: TestClient, query: str) -> None:
    r = client.get(f"/?{query}")
    assert r.status_code == 400
    assert 'class="error"' in r.text


def test_search_finds_new_turn_text_and_answers(client: TestClient, built: Built) -> None:
    assert ids_on(client.get("/?q=tokenizer").text) == [built.ids["turn2"]]  # asked in turn 2 only
    assert ids_on(client.get("/?q=Canberra").text) == [built.ids["replay"], built.ids["sdk"]]  # the answer
    # a prefix: turn 3's new text is the tool result "def tokenize(...)"
    assert ids_on(client.get("/?q=tokeni*").text) == [built.ids["turn3"], built.ids["turn2"]]
    assert ids_on(client.get('/?q="read+tokenizer.py"').text) == [built.ids["turn2"]]
    assert ids_on(client.get("/?q=canberra&tag=replay").text) == [built.ids["replay"]]
    assert ids_on(client.get("/?q=nothing-like-this").text) == []
    page = client.get("/?q=zebra").text
    assert ids_on(page) == [built.ids["error"]] and "<mark>zebra</mark>" in page
    # the opening user message is resent by turns 2 and 3 but indexed only once, for turn 1
    assert ids_on(client.get("/?q=flaky").text) == [built.ids["turn1"]]


def test_search_syntax_is_never_an_error(client: TestClient) -> None:
    for q in ['"', "AND OR NOT", "a:b", "(", "*", "NEAR(", "'; drop table exchanges; --"]:
        assert client.get("/", params={"q": q}).status_code == 200


def test_keyset_pagination(built: Built) -> None:
    from tapfix.proxy.store.filters import Filters

    store = StoreLocator.of(built.path).backend().browse(search=False)
    first = store.list_exchanges(Filters(), limit=3)
    assert [r["id"] for r in first.rows] == [built.ids[k] for k in ("xss", "error", "replay")]
    assert first.newer is None and first.older == built.ids["replay"]
    second = store.list_exchanges(Filters(), before=first.older or "", limit=3)
    assert [r["id"] for r in second.rows] == [built.ids[k] for k in ("sdk", "turn3", "turn2")]
    assert second.newer == built.ids["sdk"]
    third = store.list_exchanges(Filters(), before=second.older or "", limit=3)
    assert [r["id"] for r in third.rows] == [built.ids["turn1"]] and third.older is None
    back = store.list_exchanges(Filters(), after=second.newer or "", limit=3)
    assert [r["id"] for r in back.rows] == [built.ids[k] for k in ("xss", "error", "replay")]
    assert back.newer is None
    html = (
        TestClient(create_app(built.path, background_index=False), base_url="http://127.0.0.1")
        .get(f"/?before={built.ids['sdk']}&model=qwen3")
        .text
    )
    assert ids_on(html) == [built.ids[k] for k in ("turn3", "turn2", "turn1")]
    assert f"after={built.ids['turn3']}" in html and "model=qwen3" in html


def test_exchange_page_request_diff_and_changes(client: TestClient, built: Built) -> None:
    r = client.get(f"/exchange/{built.ids['turn1']}")
    assert r.status_code == 200
    html = r.text
    assert "changes (2)" in html
    assert "sampling: added $.temperature = 0.6 (the client sent none)" in html
    assert '<span class="add">+  &#34;temperature&#34;: 0.6,</span>' in html
    assert "as sent by the client" in html and "as forwarded upstream" in html
    assert f"tapfix replay {built.ids['turn1']} --db {built.path.resolve()}" in html
    assert f"/exchange/{built.ids['turn1']}/body/forwarded" in html
    assert "sk-very-secret-key" not in html and "authorization" in html.lower()
    assert "next turn" in html and "ses_opencode_1" in html


def test_exchange_page_repairs_before_and_after(client: TestClient, built: Built) -> None:
    html = client.get(f"/exchange/{built.ids['turn2']}").text
    assert "repaired tool calls" in html and "concatenated_json" in html
    assert "two JSON objects glued together" in html
    before = re.search(r'<pre class="del">(.*?)</pre>', html, re.S)
    after = re.search(r'<pre class="add">(.*?)</pre>', html, re.S)
    assert before and "tokenizer.py&#34;}{" in before.group(1)
    assert after and "}{" not in after.group(1)
    assert "tool calls (1)" in html and "<code>read</code>" in html


def test_exchange_page_timeline(client: TestClient, built: Built) -> None:
    html = client.get(f"/exchange/{built.ids['turn3']}").text
    assert '<svg class="timeline"' in html
    assert html.count('<rect class="stall"') == 1
    assert "1 stall" in html and "TTFT 300 ms" in html
    assert "decode 12.1 tokens/s" in html
    assert "runaway_length" in html


def test_exchange_page_non_streamed_and_replays(client: TestClient, built: Built) -> None:
    html = client.get(f"/exchange/{built.ids['sdk']}").text
    assert "Canberra is the capital." in html and "not streamed" in html
    assert "replays (1)" in html and f'href="/exchange/{built.ids["replay"]}"' in html
    assert '<svg class="timeline"' not in html
    html = client.get(f"/exchange/{built.ids['replay']}").text
    assert "replay of" in html and f'href="/exchange/{built.ids["sdk"]}"' in html
    html = client.get(f"/exchange/{built.ids['error']}").text
    assert "upstream overloaded" in html  # the engine's own error object wins over the connection's words


def test_exchange_prefix_redirects_and_unknown_is_404(client: TestClient, built: Built) -> None:
    r = client.get(f"/exchange/{built.ids['sdk'][:14]}", follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == f"/exchange/{built.ids['sdk']}"
    assert client.get("/exchange/zzzzzzzz").status_code == 404


def test_downloads_are_exact_bytes_as_attachments(client: TestClient, built: Built) -> None:
    conn = sqlite3.connect(built.path)
    from tapfix.proxy.store.sqlite.reader import capture_body, load_capture

    conn.row_factory = sqlite3.Row
    capture = load_capture(conn, built.ids["turn1"])
    for which in ("request", "forwarded", "response"):
        r = client.get(f"/exchange/{built.ids['turn1']}/body/{which}")
        assert r.status_code == 200
        assert r.content == capture_body(conn, capture, which)
        assert r.headers["content-type"] == "application/octet-stream"
        assert r.headers["content-disposition"].startswith("attachment;")
    assert b"temperature" in client.get(f"/exchange/{built.ids['turn1']}/body/forwarded").content
    assert b"temperature" not in client.get(f"/exchange/{built.ids['turn1']}/body/request").content
    assert client.get(f"/exchange/{built.ids['turn1']}/body/secrets").status_code == 404
    assert client.get("/exchange/zzzzzzzz/body/request").status_code == 404


def test_bundle_link_and_download(client: TestClient, built: Built) -> None:
    html = client.get(f"/exchange/{built.ids['sdk']}").text
    if not export_available():
        assert "/bundle" not in html
        assert client.get(f"/exchange/{built.ids['sdk']}/bundle").status_code == 404
        return
    assert f"/exchange/{built.ids['sdk']}/bundle" in html
    r = client.get(f"/exchange/{built.ids['sdk']}/bundle")
    assert r.status_code == 200 and r.headers["content-disposition"].startswith("attachment;")
    names = zipfile.ZipFile(io.BytesIO(r.content)).namelist()
    assert names and all(n.startswith(f"tapfix-bundle-{built.ids['sdk']}/") for n in names)


def test_sessions_page(client: TestClient, built: Built) -> None:
    html = client.get("/sessions").text
    assert "ses_opencode_1" in html and OPENCODE.split()[0] in html
    row = re.search(r"ses_opencode_1</a>.*?</tr>", html, re.S)
    assert row and '<td class="num">3</td>' in row.group(0) and "480→63" in row.group(0)


def test_session_page_turn_by_turn(client: TestClient, built: Built) -> None:
    r = client.get("/session/ses_opencode_1")
    assert r.status_code == 200
    html = r.text
    assert ids_on(html) == [built.ids[k] for k in ("turn1", "turn2", "turn3")]
    assert "2 messages resent unchanged, 2 new" in html and "4 messages resent unchanged, 2 new" in html
    assert "Go ahead, read tokenizer.py first" in html and "def tokenize(s)" in html
    assert "1 repair" in html and "runaway_length" in html and "160→14 tokens" in html
    assert client.get("/session/no-such-session").status_code == 404


def test_session_page_pagination(built: Built) -> None:
    from tapfix.proxy.browse.session_turns import session_view

    store = StoreLocator.of(built.path).backend().browse(search=False)
    stored = store.load_session("ses_opencode_1", limit=2)
    assert stored is not None
    first = session_view(stored)
    assert [t.number for t in first.turns] == [1, 2] and first.later
    stored = store.load_session("ses_opencode_1", after=str(first.later), limit=2)
    assert stored is not None
    rest = session_view(stored)
    assert rest is not None and [t.number for t in rest.turns] == [3] and rest.later is None
    assert rest.turns[0].delta is not None and rest.turns[0].delta.kept == 4  # compared with turn 2's body


def test_stats_page(client: TestClient, built: Built) -> None:
    client.app.state.store.catch_up()  # type: ignore[attr-defined]  # the derived counts come from it
    html = client.get("/stats").text
    assert "7 requests" in html
    assert "opencode/0.4.2 ai-sdk/4.3.16" in html and "llama-3.1-8b" in html
    assert re.search(r'href="/\?flag=no_sampling_params">1</a> flagged', html)
    # derived from bodies: turns 1-3 (opencode sent no sampling), the error request, the xss one
    assert "<b>5</b> carried none of temperature" in html
    assert "concatenated_json" in html and "bad_name" in html
    assert '<svg class="histogram"' in html and "time to first token" in html and "decode rate" in html
    assert "<code>$.temperature</code>" in html  # the sampling injection
    html = client.get("/stats?client=opencode").text
    assert "3 requests" in html and "bad_name" not in html
    assert client.get("/stats?since=nonsense").status_code == 400


def test_static_assets(client: TestClient) -> None:
    js = client.get("/static/browse.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    css = client.get("/static/browse.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]
    assert client.get("/static/other.js").status_code == 404


def test_every_route_sends_the_security_headers(client: TestClient, built: Built) -> None:
    for url in (
        "/",
        "/stats",
        "/sessions",
        "/session/ses_opencode_1",
        f"/exchange/{built.ids['sdk']}",
        f"/exchange/{built.ids['sdk']}/body/request",
        "/static/browse.js",
        "/exchange/nope",
        "/nope",
    ):
        r = client.get(url)
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp, url
        assert r.headers["x-content-type-options"] == "nosniff"


def test_search_off(built: Built) -> None:
    app = create_app(built.path, search=False)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        html = c.get("/?q=tokenizer").text
        assert "search is off" in html
        assert "carried none of temperature" not in c.get("/stats").text


def test_reads_while_the_proxy_writes(tmp_path: Path) -> None:
    from tapfix.proxy.exchange import Exchange
    from tapfix.proxy.store.writer import CaptureWriter

    built = build_db(tmp_path / "live.db")
    writer = CaptureWriter(built.path)  # a live writer holds the db open in WAL mode
    try:
        with TestClient(create_app(built.path, background_index=False), base_url="http://127.0.0.1") as c:
            assert len(ids_on(c.get("/").text)) == 7
            ex = Exchange(
                method="POST",
                path="/v1/chat/completions",
                model="late-model",
                status=200,
                request=b'{"messages": [{"role": "user", "content": "late arrival"}]}',
            )
            writer.submit(ex)
            writer._queue.put(None)  # drain without closing the connection
            writer._thread.join(5)
            assert ids_on(c.get("/").text)[0] == ex.id
            assert ids_on(c.get("/?q=arrival").text) == [ex.id]
    finally:
        writer.backend.conn.close()  # type: ignore[attr-defined]  # SQLite's


def test_missing_db_fails_at_start(tmp_path: Path) -> None:
    from tapfix.proxy.store.errors import StoreError

    with pytest.raises(StoreError):
        create_app(tmp_path / "absent.db")


def test_aggregates_are_served_stale_while_a_thread_refreshes(built: Built) -> None:
    import threading
    import time

    store = StoreLocator.of(built.path).backend().browse(search=False)
    calls: list[int] = []
    done = threading.Event()

    def compute() -> int:
        calls.append(1)
        if len(calls) > 1:
            done.set()
        return len(calls)

    assert store.cached("k", 0.0, compute) == 1  # the first request computes
    assert store.cached("k", 0.0, compute) == 1  # stale value at once, refresh in the background
    assert done.wait(5)
    deadline = time.monotonic() + 5
    while store.cached("k", 60.0, compute) != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.cached("k", 60.0, compute) == 2


# -- regeneration attempts (issue 19) ------------------------------------------------------------------
@dataclass
class Regenerated:
    path: Path
    plain: str
    parent: str
    attempts: list[str]  # attempt 2, attempt 3


@pytest.fixture(scope="module")
def regen(tmp_path_factory: pytest.TempPathFactory) -> Regenerated:
    """A plain request, and one the proxy regenerated twice (attempt 2 broken again, attempt 3 fine)."""
    path = tmp_path_factory.mktemp("regen") / "captures.db"
    plain = attempt_exchange()
    *attempts, parent = regenerated(attempts=2)
    write_exchanges(path, [plain, *attempts, parent])
    return Regenerated(path, plain.id, parent.id, [a.id for a in attempts])


@pytest.fixture(scope="module")
def regen_client(regen: Regenerated) -> Iterator[TestClient]:
    with TestClient(create_app(regen.path, background_index=False), base_url="http://127.0.0.1") as c:
        yield c


def test_list_filters_on_regenerated_and_marks_attempts(regen_client: TestClient, regen: Regenerated) -> None:
    assert ids_on(regen_client.get("/?flag=regenerated").text) == [regen.parent]
    page = regen_client.get("/").text
    assert '<option value="regenerated">regenerated (1)</option>' in page
    for n, attempt in enumerate(regen.attempts, start=2):
        assert re.search(rf'{attempt}</a> <a class="tag" href="/exchange/{regen.parent}"[^>]*>attempt {n}</a>', page)


def test_parent_page_shows_its_attempts(regen_client: TestClient, regen: Regenerated) -> None:
    page = regen_client.get(f"/exchange/{regen.parent}").text
    section = page[page.index("<h2>regeneration attempts (2)</h2>") :]
    section = section[: section.index("</section>")]
    assert ids_on(section) == regen.attempts
    for n in (2, 3):
        assert f"<td>{n}</td>" in section and f"regenerate attempt {n}: arguments cut" in section
    assert "invalid_tool_call" in section  # attempt 2 broke again
    plain = regen_client.get(f"/exchange/{regen.plain}").text
    assert "regeneration attempts" not in plain


def test_attempt_page_links_back_to_its_parent(regen_client: TestClient, regen: Regenerated) -> None:
    page = regen_client.get(f"/exchange/{regen.attempts[0]}").text
    assert f'<dt>attempt</dt><dd>2, regenerated for <a href="/exchange/{regen.parent}">{regen.parent}</a>' in page
    assert "regeneration attempts" not in page


def test_stats_count_one_client_request_per_parent(regen_client: TestClient) -> None:
    page = regen_client.get("/stats").text
    assert "<p>2 requests" in page and "2 regeneration attempts" in page
    assert re.search(r'<td class="num">2</td><td class="num">', page)  # the client/model row: 2 requests


def test_an_older_store_browses_without_attempts(tmp_path: Path) -> None:
    """A store from before migration m004 (the browser never migrates): every page still works."""
    path = tmp_path / "old.db"
    old = attempt_exchange()
    write_exchanges(path, [old])
    as_before_attempts(path)
    with TestClient(create_app(path, background_index=False), base_url="http://127.0.0.1") as c:
        assert ids_on(c.get("/").text) == [old.id]
        assert c.get(f"/exchange/{old.id}").status_code == 200
        assert "<p>1 requests" in c.get("/stats").text


def test_stats_count_the_attempts_of_the_requests_they_filter(regen_client: TestClient) -> None:
    assert "<p>1 requests" in regen_client.get("/stats?flag=regenerated").text
    assert "2 regeneration attempts" in regen_client.get("/stats?flag=regenerated").text
    assert "regeneration attempt" not in regen_client.get("/stats?flag=no_such_flag").text
