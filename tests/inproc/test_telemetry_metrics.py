"""The metrics in-process: a real capture writer tells its `TurnFanout`, which feeds the one
aggregation; `/tapfix/metrics`' exposition and the OTLP export (to a loopback receiver decoding the
protocol's messages) of it must hold the same numbers, series by series, under their own names.
Delta temporality, the histogram's buckets against a naive count, label bounds, a failing sink too."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from tapfix.proxy.changes import Change
from tapfix.proxy.config.file import Config, ModelConfig, Upstream
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.writer import CaptureWriter
from tapfix.proxy.telemetry import semconv as sc
from tapfix.proxy.telemetry.aggregate import Aggregation, HistogramAggregate
from tapfix.proxy.telemetry.metrics import CATALOGUE, CATALOGUES, OTHER, QUEUE_DEPTH, TIME_PER_OUTPUT_CHUNK, Labeller
from tapfix.proxy.telemetry.observe import TurnFanout
from tapfix.proxy.telemetry.prometheus import PrometheusExposition
from tapfix.proxy.telemetry.turn import Turn, TurnContext

from tests.support.builders import chat_chunk, sse_events
from tests.support.ci import unavailable
from tests.support.depth import examples

CONTEXT = TurnContext(engine_of={"local": "vllm"}.get)


@pytest.fixture
def receiver() -> Iterator[Any]:
    try:
        import opentelemetry.sdk.metrics  # noqa: F401 - tapfix[otel], what the export needs

        from tests.support.otlp_receiver import OtlpReceiver
    except ImportError as e:
        unavailable(f"OTLP export needs tapfix[otel] and opentelemetry-proto ({e.name})")
    handle = OtlpReceiver()
    yield handle
    handle.close()


def _aggregation(depth: float = 7.0) -> Aggregation:
    return Aggregation(Labeller(), {QUEUE_DEPTH: lambda: depth})


def _exporting(aggregation: Aggregation, url: str) -> Any:
    from tapfix.proxy.telemetry.config import export_config
    from tapfix.proxy.telemetry.otel_metrics import OtlpMetrics

    export = export_config(url, {}, None)
    assert export is not None
    return OtlpMetrics.exporting(aggregation, export, {})


def _exchange(model: str, *, stream: bool = True, **kw: Any) -> Exchange:
    path = "/v1/chat/completions"
    request = {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    ex = Exchange(method="POST", path=path, url=f"http://127.0.0.1:8080{path}", request=json.dumps(request).encode())
    ex.upstream_url = f"http://10.0.0.5:8000{path}"
    ex.extra["target"] = "local"
    ex.note_request_json(request)
    ex.status, ex.stream = 200, stream
    usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    if stream:
        ex.content_type = "text/event-stream"
        ex.response_chunks = sse_events(
            [
                chat_chunk({"role": "assistant", "content": "a"}),
                chat_chunk({"content": "b"}),
                chat_chunk({}, finish_reason="stop", usage=usage),
            ]
        )
        ex.chunk_times = [0.1, 0.15, 0.25, 0.3, 0.31][: len(ex.response_chunks)]
    else:
        ex.content_type = "application/json"
        message = {"role": "assistant", "content": "ab"}
        ex.response = json.dumps(
            {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}
        ).encode()
    for key, value in kw.items():
        setattr(ex, key, value)
    ex.ended_at = ex.mark + 0.5
    return ex


def _traffic(tmp_path: Path, sinks: list[Any]) -> TurnFanout:
    writer = CaptureWriter(tmp_path / "m.db")
    fanout = TurnFanout(CONTEXT)
    for sink in sinks:
        fanout.add(sink)
    writer.observers.append(fanout)
    repair = Change("toolcalls", "invalid_json", "$.choices[0].tool_calls[0]", reason="python_literal")
    stripped = Change("request", "strip_billing_line", "$.messages[0]", reason="billing line")
    # Two turns of one session whose second rewrote the first's user message: a prefix break.
    session = [("x-session-id", "s1")]
    turn = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    rewritten = [turn[0], {"role": "user", "content": "hello"}]
    for ex in (
        _exchange("m"),
        _exchange("m", stream=False, request_headers=session, request=json.dumps({"messages": turn}).encode()),
        _exchange(
            "m",
            changes=[repair, stripped],
            request_headers=session,
            request=json.dumps({"messages": rewritten}).encode(),
        ),
        _exchange("m", attempt_of="01jparent", attempt=2),
    ):
        writer.submit(ex)
    writer.close()
    return fanout


def _prometheus(aggregation: Aggregation) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape by (name, labels)."""
    body, _ = PrometheusExposition(aggregation).exposition()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def _as_prometheus(inst: Any, attributes: dict[str, Any]) -> frozenset[tuple[str, str]]:
    """An OTLP point's attributes as the labels Prometheus gives the same series (unknown: "")."""
    return frozenset((label.prometheus, str(attributes.get(label.attribute, ""))) for label in inst.labels)


def test_the_scrape_and_the_otlp_export_hold_the_same_numbers_series_by_series(tmp_path: Path, receiver) -> None:
    aggregation = _aggregation()
    fanout = _traffic(tmp_path, [aggregation])
    assert fanout.health() == {"turns": 4, "turn_errors": 0, "sink_errors": {}}
    meters = _exporting(aggregation, receiver.url)
    assert meters.export_now() and meters.health()["exports"] == 1
    meters.shutdown()
    points = receiver.latest()
    prom = _prometheus(aggregation)
    unused = {sc.METRIC_CAPTURE_FAILURES, sc.METRIC_UNRECOVERABLE_CALLS}  # nothing failed in this traffic
    unused |= {sc.METRIC_OPERATION_DURATION}  # no embeddings
    unused |= {sc.METRIC_USAGE_CACHE_READ_INPUT_TOKENS, sc.METRIC_USAGE_CACHE_WRITE_INPUT_TOKENS}  # not reported
    unused |= {sc.METRIC_USAGE_REASONING_OUTPUT_TOKENS}
    unused |= {sc.METRIC_REASONING_REPLAY}  # no model replays reasoning here
    unused |= {sc.METRIC_PROMPT_TRUNCATED}  # no engine cut a prompt
    assert set(points) == {i.name for i in CATALOGUE} - unused
    series = 0
    for inst in CATALOGUE:
        stem = inst.prometheus_name + (f"_{inst.prometheus_unit}" if inst.prometheus_unit else "")
        for p in points.get(inst.name, []):
            assert p.unit == inst.unit, inst.name
            assert set(p.attributes) == {label.attribute for label in inst.labels} - {sc.ERROR_TYPE}, inst.name
            labels = _as_prometheus(inst, p.attributes)
            series += 1
            if inst.kind == "counter":
                assert p.temporality == 2 and p.value == prom[(stem + "_total", labels)], inst.name
            elif inst.kind == "histogram":
                assert p.temporality == 2 and p.bounds == inst.buckets, inst.name
                assert p.count == prom[(stem + "_count", labels)], inst.name
                assert p.total == pytest.approx(prom[(stem + "_sum", labels)]), inst.name
                by_le = {float(dict(k)["le"]): v for (n, k), v in prom.items() if n == stem + "_bucket" and labels < k}
                assert list(by_le) == [*map(float, inst.buckets or ()), math.inf], inst.name
                cumulative = list(by_le.values())
                assert list(p.buckets) == [int(b - a) for a, b in pairwise([0.0, *cumulative])], inst.name
            else:
                assert p.value == prom[(stem, labels)] == 7.0
    # The scrape has no series the export lacks.
    scraped = {
        (n.removesuffix("_count").removesuffix("_total"), k) for n, k in prom if not n.endswith(("_bucket", "_sum"))
    }
    assert len(scraped) == series

    # Token usage: counters of every token (the cost), and the per-exchange distribution beside them.
    (used_in,) = points[sc.METRIC_USAGE_INPUT_TOKENS]
    (used_out,) = points[sc.METRIC_USAGE_OUTPUT_TOKENS]
    assert (used_in.value, used_out.value) == (44, 12)
    assert used_in.attributes[sc.GEN_AI_TOKEN_MODALITY] == sc.TOKEN_MODALITY_UNKNOWN  # engines don't split it
    (per_in,) = points[sc.METRIC_OPERATION_INPUT_TOKENS]
    (per_out,) = points[sc.METRIC_OPERATION_OUTPUT_TOKENS]
    assert (per_in.count, per_in.total, per_out.total) == (4, 44, 12)
    attributes = per_in.attributes
    assert attributes[sc.GEN_AI_REQUEST_MODEL] == "m" and attributes[sc.GEN_AI_PROVIDER_NAME] == "vllm"
    assert attributes[sc.GEN_AI_OPERATION_NAME] == "chat" and attributes[sc.TAPFIX_UPSTREAM] == "local"
    assert sum(p.count or 0 for p in points[sc.METRIC_INFERENCE_DURATION]) == 4
    # Three streams of four chunks (three and [DONE]): three intervals each; the non-streamed answer none.
    (per_chunk,) = points[sc.METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK]
    assert per_chunk.count == 9 and sum(per_chunk.buckets) == 9
    assert sum(p.count or 0 for p in points[sc.METRIC_INFERENCE_TIME_TO_FIRST_CHUNK]) == 3
    (repairs,) = points[sc.METRIC_REPAIRS]
    assert (repairs.value, repairs.attributes[sc.TAPFIX_REPAIR_KIND]) == (1, "invalid_json")
    (regenerations,) = points[sc.METRIC_REGENERATIONS]
    assert (regenerations.value, regenerations.attributes[sc.TAPFIX_ATTEMPT_OUTCOME]) == (1, "ok")
    resources = {(r.get("service.name"), scope) for r, scope, _ in receiver.points()}
    assert resources == {("tapfix", sc.INSTRUMENTATION_SCOPE)}


def test_delta_temporality_exports_what_changed_since_the_last_export(
    tmp_path: Path, receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")  # the exporter reads it
    aggregation = _aggregation()
    meters = _exporting(aggregation, receiver.url)
    try:
        _traffic(tmp_path / "one", [aggregation])
        assert meters.export_now()
        first = receiver.latest()
        assert meters.export_now()  # nothing new: only the gauge
        assert set(receiver.latest()) == {sc.METRIC_WRITER_QUEUE_DEPTH}
        _traffic(tmp_path / "two", [aggregation])
        assert meters.export_now()
        third = receiver.latest()
    finally:
        meters.shutdown()
    for points in (first, third):
        (requests,) = points[sc.METRIC_REQUESTS]
        assert requests.value == 3 and requests.temporality == 1  # the client requests, not the attempt
        (per_chunk,) = points[sc.METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK]
        assert per_chunk.count == 9 and sum(per_chunk.buckets) == 9 and per_chunk.temporality == 1
    assert third[sc.METRIC_REQUESTS][0].start_ns > first[sc.METRIC_REQUESTS][0].time_ns  # since the second
    assert _prometheus(aggregation)[("tapfix_requests_total", frozenset(_REQUEST_LABELS.items()))] == 6


def test_the_v1_41_names_stay_for_a_release_behind_tapfix_genai_semconv(tmp_path: Path, receiver) -> None:
    """TAPFIX_GENAI_SEMCONV=1.41.0: semantic-conventions v1.41.0's names, in the scrape and over OTLP."""
    from tapfix.proxy.telemetry.config import export_config
    from tapfix.proxy.telemetry.otel_metrics import OtlpMetrics

    export = export_config(receiver.url, {sc.NAMING_VARIABLE: "1.41.0"}, None)
    assert export is not None and export.naming == sc.LEGACY
    aggregation = Aggregation(Labeller(), {QUEUE_DEPTH: lambda: 0.0}, CATALOGUES[export.naming])
    _traffic(tmp_path, [aggregation])
    meters = OtlpMetrics.exporting(aggregation, export, {})
    assert meters.export_now()
    meters.shutdown()
    points = receiver.latest()
    assert not {n for n in points if n.startswith("gen_ai.client.inference.")}
    tokens = {p.attributes[sc.LEGACY_GEN_AI_TOKEN_TYPE]: p for p in points[sc.LEGACY_METRIC_TOKEN_USAGE]}
    assert (tokens["input"].count, tokens["input"].total, tokens["output"].total) == (4, 44, 12)
    assert sum(p.count or 0 for p in points[sc.METRIC_OPERATION_DURATION]) == 4
    assert sum(p.count or 0 for p in points[sc.LEGACY_METRIC_TIME_TO_FIRST_CHUNK]) == 3
    assert {scope for _, scope, _ in receiver.points()} == {sc.INSTRUMENTATION_SCOPE}
    scraped = {name for name, _ in _prometheus(aggregation)}
    assert "gen_ai_client_token_usage_count" in scraped and "gen_ai_client_operation_duration_seconds_count" in scraped
    assert not {n for n in scraped if n.startswith("gen_ai_client_inference")}


def test_an_unknown_naming_is_a_usage_error() -> None:
    import click
    from tapfix.proxy.telemetry.config import export_config

    with pytest.raises(click.UsageError, match="TAPFIX_GENAI_SEMCONV 'v2': give genai-0.1.0 or 1.41.0"):
        export_config(None, {sc.NAMING_VARIABLE: "v2"}, None)  # export off: checked all the same


_REQUEST_LABELS = {"model": "m", "status_class": "2xx", "surface": "chat", "upstream": "local"}
BOUNDS = TIME_PER_OUTPUT_CHUNK.buckets or ()
VALUES = st.one_of(st.sampled_from(BOUNDS), st.floats(-1.0, 5.0, allow_nan=False))


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.lists(VALUES, max_size=40), max_size=6))
def test_histogram_buckets_match_a_naive_count(batches: list[list[float]]) -> None:
    """Both paths (a bisection per value for a few, a sort for many), bounds hit exactly included:
    bucket i holds (bounds[i-1], bounds[i]], as Prometheus' `le` and OTLP's explicit buckets mean."""
    histogram = HistogramAggregate(TIME_PER_OUTPUT_CHUNK, BOUNDS)
    for batch in batches:
        histogram.record_many(("k",), batch)
    values = [v for batch in batches for v in batch]
    snapshot = histogram.snapshot()
    if not values:
        assert snapshot == {}
        return
    point = snapshot[("k",)]
    edges = [-math.inf, *BOUNDS, math.inf]
    naive = [sum(1 for v in values if low < v <= high) for low, high in pairwise(edges)]
    assert list(point.bucket_counts) == naive
    assert point.count == len(values) and point.sum == pytest.approx(math.fsum(values))
    assert (point.min, point.max) == (min(values), max(values))


def test_histogram_recording_from_two_threads_loses_nothing() -> None:
    histogram = HistogramAggregate(TIME_PER_OUTPUT_CHUNK, BOUNDS)
    batch = [0.001 * i for i in range(32)]

    def record() -> None:
        for _ in range(500):
            histogram.record_many(("k",), batch)
            histogram.snapshot()  # a scrape meanwhile

    threads = [threading.Thread(target=record) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    point = histogram.snapshot()[("k",)]
    assert point.count == 2 * 500 * 32 == sum(point.bucket_counts)
    assert point.bucket_counts[0] == 2 * 500 * 11  # 0 .. 0.01 inclusive


def test_a_sink_that_raises_is_counted_logged_once_and_spares_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(turn: Turn) -> None:
        raise RuntimeError("a sink's bug")

    aggregation = _aggregation()
    with caplog.at_level(logging.ERROR, "tapfix.telemetry"):
        fanout = _traffic(tmp_path, [broken, aggregation])
    assert fanout.health()["sink_errors"] == {"broken": 4}
    assert len([r for r in caplog.records if r.name == "tapfix.telemetry"]) == 1
    # Three client requests; the fourth exchange is a regeneration attempt, counted apart.
    assert _prometheus(aggregation)[("tapfix_requests_total", frozenset(_REQUEST_LABELS.items()))] == 3


def test_config_mode_labels_only_the_served_names_and_quick_mode_the_first_fifty() -> None:
    upstream = Upstream("local", "http://127.0.0.1:8000", "vllm")
    models = {"coder": ModelConfig("coder", "local", "Qwen/Qwen3-Coder", aliases=("qwen",))}
    config = Labeller.for_config(Config(upstreams={"local": upstream}, models=models))
    from tapfix.proxy.telemetry.metrics import MODEL

    assert [config.value(MODEL, n) for n in ("coder", "qwen", "Qwen/Qwen3-Coder", "made-up")] == [
        "coder",
        "coder",
        OTHER,
        OTHER,
    ]
    quick = Labeller.for_config(Config.quick("http://127.0.0.1:8000"))
    names = [f"model-{i}" for i in range(60)]
    labels = [quick.value(MODEL, n) for n in names + names[:3]]
    assert labels == names[:50] + [OTHER] * 10 + names[:3]


def test_capture_failures_are_counted_by_outcome(tmp_path: Path) -> None:
    """An exchange kept in part (`capture_failed`) and one lost (the disk full) are still requests."""
    import sqlite3

    writer = CaptureWriter(tmp_path / "f.db")
    aggregation = _aggregation(0.0)
    fanout = TurnFanout(CONTEXT)
    fanout.add(aggregation)
    writer.observers.append(fanout)
    kept, lost = _exchange("m"), _exchange("m")
    errors = {kept.id: ValueError("content the writer can't store"), lost.id: sqlite3.OperationalError("disk is full")}
    write_one = writer._write_one

    def failing(ex: Exchange) -> None:
        if ex.id in errors:
            raise errors[ex.id]
        write_one(ex)

    writer._write_one = failing  # type: ignore[method-assign]
    for ex in (kept, _exchange("m"), lost):
        writer.submit(ex)
    writer.close()
    samples: dict[tuple[str, str | None], float] = {}
    for family in text_string_to_metric_families(PrometheusExposition(aggregation).exposition()[0].decode()):
        for s in family.samples:
            key = (s.name, s.labels.get("outcome"))
            samples[key] = samples.get(key, 0.0) + s.value
    assert samples[("tapfix_capture_failures_total", "kept")] == 1
    assert samples[("tapfix_capture_failures_total", "lost")] == 1
    assert samples[("tapfix_requests_total", None)] == 3
    assert fanout.health() == {"turns": 3, "turn_errors": 0, "sink_errors": {}}


def test_the_exit_flush_never_waits_past_its_deadline_for_a_receiver_that_hangs() -> None:
    """Ctrl-C with a receiver that is down: an exporter stuck in its retries is left to its daemon thread,
    the others still flush, and close() returns at the deadline instead of after the export timeout."""
    from tapfix.proxy.telemetry.observe import TurnFanout
    from tapfix.proxy.telemetry.turn import TurnContext

    hang, flushed = threading.Event(), []
    fanout = TurnFanout(TurnContext(engine_of=lambda _: None))
    fanout.add(lambda turn: None, close=lambda: hang.wait(60))
    fanout.add(lambda turn: None, close=lambda: flushed.append("spans"))
    started = time.monotonic()
    fanout.close(deadline_s=0.3)
    assert flushed == ["spans"] and time.monotonic() - started < 30  # not the hanging flush's 60 s
    hang.set()
