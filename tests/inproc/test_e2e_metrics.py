"""`/tapfix/metrics` end to end: known traffic from the openai SDK through `tapfix run` to `tapfix mock` (both
served in the test process), the scrape parsed with prometheus_client's own parser, every number checked against
what the clients saw and what the store holds. Quick mode bounds the model label (the first 50 names,
then `other`); with a token, the endpoint wants it like every other path."""

from __future__ import annotations

import gzip
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from tapfix.proxy.telemetry.metrics import LABEL_LIMIT

from tests.conftest import corpus_dir
from tests.support.builders import tool
from tests.support.inproc import InprocMock, InprocProxy, mock_and_proxy, start_proxy

TOKEN = "metrics-token-123"
REPAIR_CASE = "invalid_json__python_literals_True_None.json"  # repaired: True/None -> true/null
LIST_DIR = tool("list_dir", {"path": {"type": "string"}, "recursive": {"type": "boolean"}}, ["path"])
PROMPT = [{"role": "user", "content": "list the files"}]


def scrape(proxy: InprocProxy, headers: dict[str, str] | None = None) -> dict[str, list[Any]]:
    """Samples by sample name (`..._total`, `..._sum`, `..._bucket`), from the text format."""
    r = httpx.get(f"{proxy.url}/tapfix/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def total(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def scrape_until(proxy: InprocProxy, requests: int, timeout: float = 15.0) -> dict[str, list[Any]]:
    """The writer commits within a second: scrape once it has told the recorder of every exchange it
    wrote, and of at least `requests` (a regeneration's attempts are exchanges of their own)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = httpx.get(f"{proxy.url}/tapfix/health").json()
        writer, turns = health["capture_writer"], health["telemetry"]["fanout"]["turns"]
        if writer["queue_depth"] == 0 and turns == writer["written"] + writer["failures"] >= requests:
            break
        time.sleep(0.2)
    return scrape(proxy)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[InprocMock, InprocProxy]]:
    tmp = tmp_path_factory.mktemp("metrics")
    scenario = {
        "rules": [
            {"when": {"model": "repair-me"}, "do": "serve_case", "case": str(corpus_dir() / REPAIR_CASE)},
            {"when": {"model": "fail-me"}, "do": "http_error", "status": 500},
            {"when": {"model": "regen-me", "attempt": 1}, "do": "break_tool_call", "mode": "truncate"},
            {"when": {"model": "never-whole"}, "do": "break_tool_call", "mode": "truncate"},
        ]
    }
    with mock_and_proxy(tmp, scenario, shared=True) as (mock, proxy):
        yield mock, proxy


def test_a_scrape_counts_requests_tokens_and_repairs_and_bounds_the_model_label(stack) -> None:
    mock, proxy = stack
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    usage = {"input": 0, "output": 0}
    for _ in range(3):  # streamed, with usage in the last chunk
        stream = client.chat.completions.create(
            model="m-a", messages=PROMPT, stream=True, stream_options={"include_usage": True}
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage["input"] += chunk.usage.prompt_tokens
                usage["output"] += chunk.usage.completion_tokens
    answer = client.chat.completions.create(model="m-b", messages=PROMPT)
    assert answer.usage is not None
    repaired = client.chat.completions.create(model="repair-me", messages=PROMPT, tools=[LIST_DIR], stream=True)
    calls = [tc.function.arguments for c in repaired for tc in (c.choices[0].delta.tool_calls or []) if c.choices]
    assert "true" in "".join(calls) and "True" not in "".join(calls)  # the client got the repaired call
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="fail-me", messages=PROMPT)
    regenerated = client.chat.completions.create(model="regen-me", messages=PROMPT, tools=[LIST_DIR])
    assert regenerated.choices[0].message.tool_calls  # the second attempt's whole call
    with pytest.raises(openai.APIStatusError):  # every attempt cut: tapfix answers its verdict (502)
        client.chat.completions.create(model="never-whole", messages=PROMPT, tools=[LIST_DIR])
    samples = scrape_until(proxy, 8)

    assert total(samples, "tapfix_requests_total", model="m-a", status_class="2xx", surface="chat") == 3
    assert total(samples, "tapfix_requests_total", model="m-b", status_class="2xx") == 1
    assert total(samples, "tapfix_requests_total", model="fail-me", status_class="5xx") == 1
    used = "gen_ai_client_inference_usage_{}_tokens_total"
    assert total(samples, used.format("input"), model="m-a", modality="unknown") == usage["input"] > 0
    assert total(samples, used.format("output"), model="m-a") == usage["output"] > 0
    assert total(samples, used.format("output"), model="m-b") == answer.usage.completion_tokens
    per = "gen_ai_client_inference_operation_{}_tokens"
    assert total(samples, per.format("input") + "_count", model="m-a") == 3
    assert total(samples, per.format("input") + "_sum", model="m-a") == usage["input"]
    duration = "gen_ai_client_inference_duration_seconds"
    assert total(samples, f"{duration}_count", model="m-a", operation="chat") == 3
    assert total(samples, f"{duration}_count", model="fail-me", error_type="500") == 1
    assert total(samples, f"{duration}_bucket", model="m-a", le="+Inf") == 3
    # Streams only: one first chunk per stream, one interval per chunk after the first.
    assert total(samples, "gen_ai_client_inference_time_to_first_chunk_seconds_count", model="m-a") == 3
    assert total(samples, "gen_ai_client_inference_time_to_first_chunk_seconds_count", model="m-b") == 0
    conn = sqlite3.connect(f"file:{proxy.extra['db']}?mode=ro", uri=True)
    try:
        chunk_counts = [n for (n,) in conn.execute("select chunk_count from exchanges where model = 'm-a'")]
        rows = conn.execute("select count(*) from exchanges").fetchone()[0]
        attempts = conn.execute("select count(*) from exchanges where attempt >= 2").fetchone()[0]
        unrecoverable = conn.execute(
            "select count(*) from exchanges where flags like '%toolcall_unrecoverable%'"
        ).fetchone()[0]
        kinds = conn.execute(
            "select c.kind, count(*) from changes c join exchanges e on e.id = c.exchange_id"
            " where e.model = 'repair-me' and c.stage = 'toolcalls' group by c.kind"
        ).fetchall()
    finally:
        conn.close()
    per_chunk = "gen_ai_client_inference_time_per_output_chunk_seconds_count"
    assert total(samples, per_chunk, model="m-a") == sum(n - 1 for n in chunk_counts) > 0
    assert kinds, "the corpus case must be repaired"
    for kind, count in kinds:
        assert total(samples, "tapfix_repairs_total", model="repair-me", kind=kind) == count
    # A regeneration's own records (the verdict, the new attempt's seed) are no repairs.
    assert {s.labels["kind"] for s in samples["tapfix_repairs_total"]} == {kind for kind, _ in kinds}
    assert total(samples, "tapfix_requests_total") == rows - attempts, "client requests: attempts are counted apart"
    # The first attempt's call was cut (unrecoverable); tapfix asked again, and the client got the second.
    assert total(samples, "tapfix_regenerations_total", model="regen-me", outcome="ok") >= 1
    assert total(samples, "tapfix_regenerations_total", model="never-whole", outcome="unrecoverable") >= 1
    assert total(samples, "tapfix_regenerations_total") == attempts
    # What reached a client unrecoverable (a call regenerated whole is flagged `regenerated` instead).
    assert total(samples, "tapfix_unrecoverable_calls_total", model="never-whole") == unrecoverable >= 1
    assert total(samples, "tapfix_capture_failures_total") == 0
    assert samples["tapfix_writer_queue_depth"][0].value == 0

    # Quick mode: the first 50 distinct model names keep their label, every later one is `other`.
    seen = {"m-a", "m-b", "repair-me", "fail-me", "regen-me", "never-whole"}
    fillers = [f"filler-{i}" for i in range(LABEL_LIMIT - len(seen))]
    for model in fillers:
        client.chat.completions.create(model=model, messages=PROMPT, max_tokens=4)
    scrape_until(proxy, rows + len(fillers))  # the 50 names are taken before the next ones arrive
    for model in ("one-too-many", "two-too-many"):
        client.chat.completions.create(model=model, messages=PROMPT, max_tokens=4)
    samples = scrape_until(proxy, rows + len(fillers) + 2)
    models = {s.labels["model"] for s in samples["tapfix_requests_total"]}
    assert models == seen | set(fillers) | {"other"} and len(models) == LABEL_LIMIT + 1
    assert total(samples, "tapfix_requests_total", model="other") == 2

    health = httpx.get(f"{proxy.url}/tapfix/health").json()["telemetry"]
    assert health["fanout"]["turns"] == rows + len(fillers) + 2 and health["fanout"]["sink_errors"] == {}


def test_openmetrics_when_the_scraper_asks(stack) -> None:
    _, proxy = stack
    r = httpx.get(f"{proxy.url}/tapfix/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/openmetrics-text")
    names = {family.name for family in openmetrics_families(r.text)}
    assert {"tapfix_requests", "gen_ai_client_inference_duration_seconds", "tapfix_writer_queue_depth"} <= names


def test_the_scrape_is_gzipped_when_the_scraper_accepts_it(stack) -> None:
    """Prometheus sends `Accept-Encoding: gzip`: the text repeats every label on every bucket line."""
    _, proxy = stack
    url = f"{proxy.url}/tapfix/metrics"
    plain = httpx.get(url, headers={"accept-encoding": "identity"})
    assert "content-encoding" not in plain.headers and b"tapfix_requests" in plain.content
    with httpx.stream("GET", url, headers={"accept-encoding": "gzip"}) as r:
        raw = b"".join(r.iter_raw())
        assert r.headers["content-encoding"] == "gzip" and "accept-encoding" in r.headers["vary"].lower()
    text = gzip.decompress(raw)
    assert {f.name for f in text_string_to_metric_families(text.decode())} == {
        f.name for f in text_string_to_metric_families(plain.text)
    }
    assert len(raw) < len(text) / 3
    refused = httpx.get(url, headers={"accept-encoding": "gzip;q=0, identity"})
    assert "content-encoding" not in refused.headers


def test_with_a_token_the_endpoint_wants_it(stack, tmp_path: Path) -> None:
    mock, _ = stack
    proxy = start_proxy(tmp_path, mock.url, "--token", TOKEN)
    try:
        denied = httpx.get(f"{proxy.url}/tapfix/metrics")
        assert denied.status_code == 401 and "tapfix_requests" not in denied.text
        wrong = httpx.get(f"{proxy.url}/tapfix/metrics", headers={"authorization": "Bearer not-the-token"})
        assert wrong.status_code == 401
        samples = scrape(proxy, {"authorization": f"Bearer {TOKEN}"})
        assert "tapfix_writer_queue_depth" in samples
    finally:
        proxy.stop()
