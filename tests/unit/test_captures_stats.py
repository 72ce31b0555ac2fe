"""`tapfix captures stats` (issue 38): the token-volume report. Exchanges of every surface's usage shape,
routes, upstreams, clients, attempts, failures and repairs go through the real writer into each backend;
the report, grouped by each field, must sum to the captures' own token counts (computed here from what
each exchange was given, not from the store), count requests, errors and repairs per group, and give
each group's nearest-rank percentiles of the captures' own timings. PostgreSQL must say what SQLite says."""

from __future__ import annotations

import functools
import math
import random
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.changes import Change
from tapfix.proxy.cli import main
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.exchange_row import usage_details
from tapfix.proxy.store.filters import Filters
from tapfix.proxy.store.reader import CaptureReader
from tapfix.proxy.store.volume import GROUP_FIELDS, GroupError, client_product, is_local, parse_by, upstream_host

from tests.support.builders import chat_chunk, sse_events
from tests.support.sql_store import write_all
from tests.support.stores import BACKENDS, M010_MADE, Backend, make_backend, undo_sqlite_migration

UPSTREAMS = ("http://127.0.0.1:8000", "https://api.cloud.example:443", "http://gpu1.lan:8080", "")
AGENTS = ("opencode/0.4.1 ai-sdk/provider-utils/2", "claude-cli/2.0.1 (external, cli)", "OpenAI/Python 1.99.0", "")
ROUTES = (None, "long-context", "default")
SURFACES = ("chat", "responses", "messages")
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def usage_for(surface: str, tokens: tuple[int, int | None, int, int | None]) -> dict[str, Any]:
    """A usage object as `surface` reports (input, cached input, output, reasoning)."""
    inp, cached, out, reasoning = tokens
    if surface == "chat":
        usage: dict[str, Any] = {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}
        if cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        if reasoning is not None:
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        return usage
    if surface == "responses":
        usage = {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}
        usage["input_tokens_details"] = {"cached_tokens": cached}  # null where the engine says nothing
        usage["output_tokens_details"] = {"reasoning_tokens": reasoning}
        return usage
    usage = {"input_tokens": inp, "output_tokens": out}
    if cached is not None:
        usage["cache_read_input_tokens"] = cached
    return usage


def made(rng: random.Random, n: int, surface: str, parents: list[Exchange]) -> tuple[Exchange, dict[str, Any]]:
    """One exchange and what the test knows of it (its tokens, whether it failed or was repaired)."""
    upstream = rng.choice(UPSTREAMS)
    tokens = (
        rng.randint(0, 200_000),
        rng.choice([None, rng.randint(0, 5000)]),
        rng.randint(0, 9000),
        None if surface == "messages" else rng.choice([None, rng.randint(0, 3000)]),
    )
    no_usage = rng.random() < 0.1
    usage = None if no_usage else usage_for(surface, tokens)
    ex = Exchange(
        id=f"01s{n:013d}",
        started_at=START + 600 * n,  # ten minutes apart: the captures span 20 hours
        method="POST",
        model=rng.choice(["coder", "claude-haiku-4-5", "small"]),
        user_agent=rng.choice(AGENTS),
        upstream_url=f"{upstream}/v1/x" if upstream else "",
        request=b'{"model":"m","messages":[{"role":"user","content":"go"}]}',
        request_headers=[("x-session-id", rng.choice(["ses_a", "ses_b"]))],
    )
    ex.route = rng.choice(ROUTES)
    ex.status = rng.choice([200, 200, 200, 200, 500, 429])
    if parents and rng.random() < 0.15:
        ex.attempt_of, ex.attempt = rng.choice(parents).id, 2
    repaired = rng.random() < 0.2
    if repaired:
        ex.changes.append(Change("toolcalls", "repair", "$.choices[0].tool_calls[0]", reason="closed the JSON"))
    elif rng.random() < 0.2:
        ex.changes.append(Change("sampling", "inject", "$.temperature", None, 0.6))
    if surface == "chat":
        ex.path, ex.stream, ex.content_type = "/v1/chat/completions", True, "text/event-stream"
        events = [chat_chunk({"content": "hi"}), chat_chunk({"content": " there"}), chat_chunk(finish_reason="stop")]
        if usage is not None:
            events.append(chat_chunk(id="c", created=None) | {"choices": [], "usage": usage})
        ex.response_chunks = sse_events(events)
        first = rng.uniform(0.05, 3.0)
        ex.chunk_times = [first + 0.01 * i for i in range(len(ex.response_chunks))]
        ex.ended_at = ex.mark + first + rng.uniform(0.0, 20.0)
    else:
        ex.path = "/v1/responses" if surface == "responses" else "/v1/messages"
        ex.content_type = "application/json"
        body: dict[str, Any] = {"id": "r1", "object": "response", "status": "completed", "output": []}
        if surface == "messages":
            body = {"id": "m1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}]}
        if usage is not None:
            body["usage"] = usage
        ex.response = orjson.dumps(body)
        ex.ended_at = ex.mark + rng.uniform(0.1, 5.0)
    known = {
        "tokens": (0, 0, 0, 0) if no_usage else tuple(t or 0 for t in tokens),
        "failed": ex.status != 200,
        "repaired": repaired,
        "client_request": ex.attempt_of is None,
    }
    return ex, known


@functools.cache
def cases() -> tuple[list[Exchange], dict[str, dict[str, Any]]]:
    rng = random.Random(38)
    exchanges: list[Exchange] = []
    known: dict[str, dict[str, Any]] = {}
    for n in range(120):
        ex, facts = made(rng, n, SURFACES[n % 3], [e for e in exchanges if e.attempt_of is None])
        exchanges.append(ex)
        known[ex.id] = facts
    return exchanges, known


@pytest.fixture(scope="module", params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    backend = make_backend(request, tmp_path_factory.mktemp(request.param))
    write_all(backend.writer(), cases()[0])
    yield backend


@pytest.fixture(scope="module")
def captures(store: Backend) -> list[dict[str, Any]]:
    """Every capture as `captures list --json` gives it (its group's fields and timings, per capture)."""
    out = CliRunner().invoke(main, ["captures", "list", "--db", store.locator, "--limit", "0", "--json"])
    assert out.exit_code == 0, out.output
    return [orjson.loads(line) for line in out.output.splitlines()]


def stats(store: Backend, *args: str) -> list[dict[str, Any]]:
    out = CliRunner().invoke(main, ["captures", "stats", "--db", store.locator, "--since", "", "--json", *args])
    assert out.exit_code == 0, out.output
    return [orjson.loads(line) for line in out.output.splitlines()]


def field_of(capture: dict[str, Any], ex: Exchange, name: str) -> Any:
    """A capture's group, from what the test sent (the route, the upstream, the User-Agent) or the list."""
    return {
        "model": ex.model,
        "route": ex.route,
        "upstream": upstream_host(ex.upstream_url),
        "client": client_product(ex.user_agent),
        "session": capture["session_id"],
    }[name]


def nearest_rank(values: list[float], p: float) -> float | None:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1] if ordered else None


@pytest.mark.parametrize("by", [*GROUP_FIELDS, "route,upstream", "model,client,session"])
def test_stats_sum_to_the_captures_own_counts(store: Backend, captures: list[dict[str, Any]], by: str) -> None:
    exchanges, known = cases()
    by_id = {ex.id: ex for ex in exchanges}
    listed = {c["id"]: c for c in captures}
    assert set(listed) == set(by_id)
    fields = by.split(",")
    expected: dict[tuple[Any, ...], dict[str, Any]] = defaultdict(lambda: defaultdict(int))
    timings: dict[tuple[Any, ...], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for capture_id, facts in known.items():
        key = tuple(field_of(listed[capture_id], by_id[capture_id], name) for name in fields)
        group = expected[key]
        group["requests" if facts["client_request"] else "attempts"] += 1
        for name, value in zip(
            ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens"), facts["tokens"], strict=True
        ):
            group[name] += value
        group["errors"] += facts["failed"]
        group["repairs"] += facts["repaired"]
        ttft, duration = listed[capture_id]["first_token_ms"], listed[capture_id]["duration_ms"]
        if ttft is not None:
            timings[key][0].append(ttft)
            out = facts["tokens"][2]
            if out > 0 and duration - ttft > 1:
                timings[key][1].append(out * 1000.0 / (duration - ttft))
    groups = stats(store, "--by", by)
    got = {tuple(g[name] for name in fields): g for g in groups}
    assert set(got) == set(expected)
    for key, want in expected.items():
        for name in ("requests", "attempts", "input_tokens", "cached_input_tokens", "output_tokens"):
            assert got[key][name] == want[name], (key, name)
        assert got[key]["reasoning_tokens"] == want["reasoning_tokens"]
        assert got[key]["errors"] == want["errors"] and got[key]["repairs"] == want["repairs"]
        ttfts, rates = timings[key]
        assert got[key]["ttft_ms_p50"] == pytest.approx(nearest_rank(ttfts, 0.5))
        assert got[key]["ttft_ms_p95"] == pytest.approx(nearest_rank(ttfts, 0.95))
        assert got[key]["decode_tps_p50"] == pytest.approx(nearest_rank(rates, 0.5))
    # and the sum over groups is the store's whole
    total_input = sum(f["tokens"][0] for f in known.values())
    assert sum(g["input_tokens"] for g in groups) == total_input
    assert sum(g["output_tokens"] for g in groups) == sum(f["tokens"][2] for f in known.values())


def test_the_text_report_is_a_table_with_a_total(store: Backend) -> None:
    out = CliRunner().invoke(main, ["captures", "stats", "--db", store.locator, "--since", "", "--by", "route"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split()[:4] == ["ROUTE", "REQUESTS", "ATTEMPTS", "INPUT"]
    assert {line.split()[0] for line in lines[1:]} == {"long-context", "default", "-", "TOTAL"}
    total = sum(f["tokens"][0] for f in cases()[1].values())
    assert f"{total:,}" in lines[-1].split()


def test_since_keeps_only_recent_captures(store: Backend) -> None:
    assert stats(store, "--since", "1h") == []  # the cases are from 2026-01-01
    assert (
        CliRunner()
        .invoke(main, ["captures", "stats", "--db", store.locator, "--since", "1h"])
        .output.startswith("no captures since 1h")
    )


def test_reader_filters_by_the_browsers_filters(store: Backend) -> None:
    exchanges, known = cases()
    with store.store().reader() as reader:
        assert isinstance(reader, CaptureReader)
        groups = reader.token_volume(Filters(model="coder"), ["route"])
    want = sum(known[ex.id]["tokens"][0] for ex in exchanges if ex.model == "coder")
    assert sum(g["input_tokens"] for g in groups) == want


@pytest.mark.postgres
def test_postgresql_says_what_sqlite_says(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    server = request.getfixturevalue("postgres")
    made_stores = [
        Backend("sqlite", str(tmp_path / "c.db")),
        Backend("postgresql", server.create_database("same_stats")),
    ]
    for backend in made_stores:
        write_all(backend.writer(), cases()[0])
    for by in ("model,route,upstream,client,session", "client"):
        sqlite_groups, pg_groups = (stats(s, "--by", by) for s in made_stores)
        assert len(sqlite_groups) == len(pg_groups)
        for a, b in zip(sqlite_groups, pg_groups, strict=True):
            assert a.keys() == b.keys()
            for name, value in a.items():
                assert b[name] == (pytest.approx(value) if isinstance(value, float) else value), name


def test_bad_by_is_a_usage_error(tmp_path: Path) -> None:
    out = CliRunner().invoke(main, ["captures", "stats", "--db", str(tmp_path / "c.db"), "--by", "model,colour"])
    assert out.exit_code == 2 and "can't group by colour: use any of model, route" in out.output
    with pytest.raises(GroupError):
        parse_by("route,route")


@pytest.mark.parametrize(
    ("agent", "product"),
    [
        ("opencode/0.4.1 ai-sdk/provider-utils/2", "opencode"),
        ("claude-cli/2.0.1 (external, cli)", "claude-cli"),
        ("OpenAI/Python 1.99.0", "OpenAI/Python"),
        ("Anthropic/Python 0.40.0", "Anthropic/Python"),
        ("python-httpx/0.28.1", "python-httpx"),
        ("curl/8.5.0", "curl"),
        ("", None),
    ],
)
def test_client_is_the_user_agents_product(agent: str, product: str | None) -> None:
    assert client_product(agent) == product


@given(st.text(alphabet="ab/1 é٣.-", max_size=20))
def test_client_product_is_a_prefix_of_the_first_word(agent: str) -> None:
    product = client_product(agent)
    if agent:
        assert product is not None and agent.split(" ", 1)[0].startswith(product)


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1:8000", True),
        ("[::1]:8000", True),
        ("192.168.1.20:8080", True),
        ("localhost:11434", True),
        ("vllm:8000", True),
        ("gpu1.lan:8080", True),
        ("api.openai.com", False),
        ("api.cloud.example:443", False),
        ("8.8.8.8:80", False),
        (None, False),
    ],
)
def test_local_upstreams(host: str | None, local: bool) -> None:
    assert is_local(host) is local


def test_usage_details_of_each_surface() -> None:
    tokens = (1000, 600, 50, 20)
    assert usage_details(usage_for("chat", tokens)) == {"cached_tokens": 600, "reasoning_tokens": 20}
    assert usage_details(usage_for("responses", tokens)) == {"cached_tokens": 600, "reasoning_tokens": 20}
    assert usage_details(usage_for("messages", tokens)) == {"cached_tokens": 600, "reasoning_tokens": None}
    assert usage_details({"prompt_tokens_details": {"cached_tokens": "many"}}) == {
        "cached_tokens": None,
        "reasoning_tokens": None,
    }


@pytest.fixture(params=BACKENDS)
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request, tmp_path)


def as_before_the_report(store: Backend) -> None:
    """The store as a tapfix before issue 38 left it: no route, cached or reasoning columns."""
    drops = "drop column route, drop column cached_tokens, drop column reasoning_tokens"
    if store.name == "sqlite":
        undo_sqlite_migration(store.locator, "m010_route_and_token_details", *M010_MADE)
        return
    import psycopg

    with psycopg.connect(store.locator, autocommit=True) as pg:
        pg.execute(f"drop index exchanges_route; alter table exchanges {drops}".encode())
        pg.execute(b"delete from tapfix_migrations where name = 'pg009_route_and_token_details'")


def test_an_older_store_reports_and_its_writer_fills_the_new_columns(fresh: Backend) -> None:
    exchanges, known = cases()
    write_all(fresh.writer(), exchanges[:30])
    as_before_the_report(fresh)
    before = {g["model"]: g for g in stats(fresh, "--by", "model,route")}  # read as it is: no route, no details
    assert {g["route"] for g in stats(fresh, "--by", "route")} == {None}
    assert sum(g["cached_input_tokens"] for g in before.values()) == 0
    assert sum(g["input_tokens"] for g in before.values()) == sum(known[ex.id]["tokens"][0] for ex in exchanges[:30])
    write_all(fresh.writer(), [])  # a writer migrates it: the old rows get their details from their usage
    after = stats(fresh, "--by", "model")
    assert sum(g["cached_input_tokens"] for g in after) == sum(known[ex.id]["tokens"][1] for ex in exchanges[:30])
    assert sum(g["reasoning_tokens"] for g in after) == sum(known[ex.id]["tokens"][3] for ex in exchanges[:30])


def test_the_stats_page_draws_the_report(tmp_path: Path) -> None:
    """The browser's /stats: the table's numbers, tokens per route per hour, and the share that went local."""
    from starlette.testclient import TestClient
    from tapfix.proxy.browse import create_app

    exchanges, known = cases()
    path = tmp_path / "c.db"
    write_all(Backend("sqlite", str(path)).writer(), exchanges)
    with TestClient(create_app(path, background_index=False), base_url="http://127.0.0.1") as client:
        page = client.get("/stats?by=route")
        assert page.status_code == 200
        html = page.text
        assert client.get("/stats?by=colour").status_code == 400
    per_route: dict[str, int] = defaultdict(int)
    local = 0
    for ex in exchanges:
        tokens = known[ex.id]["tokens"][0] + known[ex.id]["tokens"][2]
        per_route[ex.route or "-"] += tokens
        local += tokens if is_local(upstream_host(ex.upstream_url)) else 0
    drawn: dict[str, int] = defaultdict(int)
    for route, tokens in re.findall(r"<title>\d{4}-\d\d-\d\d \d\d:00 UTC ([^:]+): ([\d,]+) tokens</title>", html):
        drawn[route] += int(tokens.replace(",", ""))
    assert drawn == per_route
    total = sum(per_route.values())
    assert f"{100 * local / total:.0f}% of tokens went to local upstreams ({local:,} of {total:,})" in html
    rows = re.findall(
        r"<tr><td class=\"clip\">([^<]*)</td><td class=\"num\">([\d,]+)</td><td class=\"num\">[\d,]+</td>"
        r"<td class=\"num\">([\d,]+)</td>",
        html,
    )
    inputs = {route: int(value.replace(",", "")) for route, _, value in rows}
    want: dict[str, int] = defaultdict(int)
    for ex in exchanges:
        want[ex.route or "-"] += known[ex.id]["tokens"][0]
    assert inputs == want
    shares = re.findall(r"UTC: (\d+)% local \(([\d,]+) of ([\d,]+) tokens\)", html)
    assert sum(int(of.replace(",", "")) for _, _, of in shares) == total
