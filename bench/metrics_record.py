"""What recording one exchange's metrics costs the capture writer's thread: µs per 256-chunk stream.

Why: the per-chunk histogram (`gen_ai.client.inference.time_per_output_chunk`) takes ~255 values per
256-chunk stream, and the writer thread holds the GIL against the event loop while it records. tapfix
records an exchange once into its own aggregation (`tapfix.proxy.telemetry.aggregate`), which both
`/tapfix/metrics` and the OTLP export read. For reference the script also times what recording each
value into prometheus_client and into the OpenTelemetry SDK's meter costs (the two recorders tapfix
had before), and the per-snapshot costs the new path moves off the writer: a scrape, an OTLP build.

    .venv/bin/python bench/metrics_record.py [--chunks 256] [--repeat 2000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from tapfix.proxy.telemetry.aggregate import Aggregation, HistogramAggregate
from tapfix.proxy.telemetry.metrics import (
    CATALOGUE,
    QUEUE_DEPTH,
    TIME_PER_OUTPUT_CHUNK,
    Labeller,
    attributes,
    key_of,
    label_values,
    observations,
)
from tapfix.proxy.telemetry.prometheus import PrometheusExposition
from tapfix.proxy.telemetry.turn import Turn


def stream_turn(chunks: int) -> Turn:
    """A finished 256-chunk chat stream through a vllm upstream, one tool-call repair."""
    intervals = tuple(0.004 + 0.0007 * (i % 97) for i in range(chunks - 1))
    return Turn(
        capture_id="01bench", outcome="stored", surface="chat", operation="chat", provider="vllm",
        upstream="local", public_model="coder", request_model="Qwen/Qwen3-Coder", response_model="Qwen/Qwen3-Coder",
        response_id="chatcmpl-1", finish_reasons=("stop",), input_tokens=1200, output_tokens=chunks,
        reasoning_tokens=None, cached_tokens=None, started_at=time.time(), duration_s=1.5,
        time_to_first_chunk_s=0.12, chunk_intervals_s=intervals, stream=True, status=200, status_class="2xx",
        error_type=None, repairs={"invalid_json": 1}, unrecoverable=False, attempt=1, attempt_of=None,
        flags=frozenset(), changes=(), trace_id=None, span_id=None, parent_span_id=None, request_params={},
    )  # fmt: skip


def per_call(fn: Callable[[], Any], repeat: int) -> float:
    """CPU µs per call (process time: what the writer thread takes from the event loop)."""
    fn()  # warm: series created, imports done
    start = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - start) / repeat * 1e6


def prometheus_client_recorder(labeller: Labeller) -> Callable[[Turn], None]:
    """Each value into prometheus_client's own metrics (the recorder tapfix had before the aggregation)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    registry, metrics = CollectorRegistry(), {}
    for inst in CATALOGUE:
        names = [label.prometheus for label in inst.labels]
        if inst.kind == "counter":
            metrics[inst] = Counter(inst.prometheus_name, inst.description, names, registry=registry)
        elif inst.kind == "histogram":
            metrics[inst] = Histogram(inst.prometheus_name, inst.description, names, buckets=inst.buckets or (1,))

    def record(turn: Turn) -> None:
        for inst, values, labels in observations(turn, labeller):
            metric = metrics[inst].labels(*label_values(key_of(inst, labels)))
            observe = metric.inc if inst.kind == "counter" else metric.observe
            for value in values:
                observe(value)

    return record


def otel_sdk_recorder(labeller: Labeller) -> Callable[[Turn], None] | None:
    """Each value into the OpenTelemetry SDK's meter (the OTLP recorder tapfix had before)."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    except ImportError:
        return None
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("bench")
    instruments: dict[Any, Any] = {}
    for inst in CATALOGUE:
        if inst.kind == "counter":
            instruments[inst] = meter.create_counter(inst.name, inst.unit).add
        elif inst.kind == "histogram":
            create = meter.create_histogram
            instruments[inst] = create(inst.name, inst.unit, explicit_bucket_boundaries_advisory=inst.buckets).record

    def record(turn: Turn) -> None:
        for inst, values, labels in observations(turn, labeller):
            add, named = instruments[inst], attributes(inst, key_of(inst, labels))
            for value in values:
                add(value, named)

    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    turn, labeller = stream_turn(args.chunks), Labeller()
    values = turn.chunk_intervals_s
    aggregation = Aggregation(labeller, {QUEUE_DEPTH: lambda: 0.0})
    histogram = HistogramAggregate(TIME_PER_OUTPUT_CHUNK, TIME_PER_OUTPUT_CHUNK.buckets or ())

    print(f"one {args.chunks}-chunk stream ({len(values)} per-chunk values), CPU µs, {args.repeat} repeats")
    whole = per_call(lambda: aggregation(turn), args.repeat)
    alone = per_call(lambda: histogram.record_many(("k",), values), args.repeat)
    print(f"  tapfix aggregation, the whole exchange        {whole:8.1f} µs")
    print(f"    the per-chunk histogram alone (record_many) {alone:8.1f} µs  ({alone / len(values):.3f} µs a value)")
    prometheus = prometheus_client_recorder(labeller)
    before = per_call(lambda: prometheus(turn), max(args.repeat // 10, 20))
    print(f"  before: prometheus_client, value by value     {before:8.1f} µs")
    otel = otel_sdk_recorder(labeller)
    if otel is None:
        print("  before: OpenTelemetry SDK meter: not installed (tapfix[otel])")
    else:
        sdk = per_call(lambda: otel(turn), max(args.repeat // 20, 10))
        print(
            f"  before: OpenTelemetry SDK meter, by value     {sdk:8.1f} µs  (export on: both, {before + sdk:.1f} µs)"
        )

    exposition = PrometheusExposition(aggregation)
    scrape = per_call(exposition.exposition, 200)
    print(f"per scrape of /tapfix/metrics (text format)     {scrape:8.1f} µs  (reader's thread, not the writer's)")
    try:
        from opentelemetry.sdk.resources import Resource
        from tapfix.proxy.telemetry.otel_metrics import metrics_data
    except ImportError:
        return
    resource = Resource.create({"service.name": "tapfix"})
    build = per_call(lambda: metrics_data(aggregation.snapshot(), None, aggregation.started, {}, resource), 200)
    print(f"per OTLP export, snapshot to MetricsData        {build:8.1f} µs  (export thread, every interval)")


if __name__ == "__main__":
    main()
