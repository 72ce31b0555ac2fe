"""OTLP metrics to real receivers: `tapfix run --otlp URL` exports to a loopback OTLP/HTTP receiver that
decodes `ExportMetricsServiceRequest` with opentelemetry-proto; one that takes traces only (404 on
`/v1/metrics`, as Phoenix does) and a gRPC one without the metrics service (UNIMPLEMENTED) are counted
in health and logged once, and traffic never notices."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tapfix.proxy.telemetry import semconv as sc
from tapfix.proxy.telemetry.aggregate import Aggregation
from tapfix.proxy.telemetry.metrics import CATALOGUE, QUEUE_DEPTH, Labeller

from tests.support.ci import unavailable
from tests.support.inproc import InprocMock, InprocProxy, start_mock, start_proxy
from tests.support.procs import until

PROMPT = [{"role": "user", "content": "hi"}]
FAST_EXPORT = {"OTEL_METRIC_EXPORT_INTERVAL": "200"}  # milliseconds: tapfix's export thread reads it
BY_NAME = {i.name: i for i in CATALOGUE}


@pytest.fixture(scope="module")
def receiver_class() -> Any:
    try:
        import opentelemetry.sdk.metrics  # noqa: F401 - tapfix[otel], what `--otlp` needs

        from tests.support.otlp_receiver import OtlpReceiver
    except ImportError as e:
        unavailable(f"OTLP export needs tapfix[otel] and opentelemetry-proto ({e.name})")
    return OtlpReceiver


@pytest.fixture(scope="module")
def mock(tmp_path_factory) -> Iterator[InprocMock]:
    handle = start_mock(tmp_path_factory.mktemp("otlp-mock"))
    yield handle
    handle.stop()


_until = partial(until, timeout=15.0, every=0.1)


def _stream(proxy: InprocProxy, model: str) -> tuple[int, int]:
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    stream = client.chat.completions.create(
        model=model, messages=PROMPT, stream=True, stream_options={"include_usage": True}
    )
    usage = [c.usage for c in stream if c.usage is not None][-1]
    return usage.prompt_tokens, usage.completion_tokens


def _telemetry(proxy: InprocProxy) -> dict[str, Any]:
    return httpx.get(f"{proxy.url}/tapfix/health").json()["telemetry"]


def test_a_run_exports_the_catalogue_over_otlp_http(receiver_class, mock, tmp_path: Path) -> None:
    receiver = receiver_class()
    proxy = start_proxy(tmp_path, mock.url, "--otlp", receiver.url, env=FAST_EXPORT)
    try:
        used = [_stream(proxy, "m-a") for _ in range(2)]

        def requests_counted() -> bool:
            points = receiver.latest().get(sc.METRIC_REQUESTS, [])
            return sum(p.value for p in points) == 2

        assert _until(requests_counted), receiver.latest()
        health = _telemetry(proxy)["otlp_metrics"]
        assert health["exports"] >= 1 and health["failures"] == 0, health
    finally:
        assert proxy.stop() == 0
        receiver.close()
    latest = receiver.latest()  # the flush at exit: cumulative totals of the whole run
    (used_in,) = latest[sc.METRIC_USAGE_INPUT_TOKENS]
    (used_out,) = latest[sc.METRIC_USAGE_OUTPUT_TOKENS]
    assert (used_in.value, used_out.value) == (sum(i for i, _ in used), sum(o for _, o in used))
    (per_in,) = latest[sc.METRIC_OPERATION_INPUT_TOKENS]
    assert per_in.total == sum(i for i, _ in used) and per_in.count == 2
    attributes = per_in.attributes
    assert attributes[sc.GEN_AI_REQUEST_MODEL] == "m-a" and attributes[sc.GEN_AI_OPERATION_NAME] == "chat"
    assert attributes[sc.TAPFIX_UPSTREAM] == "default" and attributes[sc.TAPFIX_SURFACE] == "chat"
    for name, points in latest.items():
        inst = BY_NAME[name]
        assert all(p.unit == inst.unit for p in points), name
        if inst.kind == "histogram":
            assert all(p.bounds == inst.buckets for p in points), name
    (duration,) = latest[sc.METRIC_INFERENCE_DURATION]
    assert duration.count == 2 and duration.total > 0
    resources = {(r.get("service.name"), scope) for r, scope, _ in receiver.points()}
    assert resources == {("tapfix", sc.INSTRUMENTATION_SCOPE)}
    assert receiver.trace_requests >= 1  # the same fan-out fed the span exporter


def test_a_receiver_without_metrics_is_counted_and_logged_once(receiver_class, mock, tmp_path: Path) -> None:
    receiver = receiver_class(metrics=False)  # traces only, like Phoenix
    proxy = start_proxy(tmp_path, mock.url, "--otlp", receiver.url, env=FAST_EXPORT)
    try:
        for _ in range(3):
            assert _stream(proxy, "m-a")[1] > 0  # traffic is unaffected
        assert _until(lambda: _telemetry(proxy)["otlp_metrics"]["failures"] >= 3)
        health = _telemetry(proxy)
        assert health["otlp_metrics"]["exports"] == 0 and "404" in health["otlp_metrics"]["last_error"]
        assert health["fanout"]["turns"] == 3 and health["fanout"]["sink_errors"] == {}
        metrics = httpx.get(f"{proxy.url}/tapfix/metrics").text  # Prometheus doesn't depend on the receiver
        assert 'tapfix_requests_total{model="m-a",status_class="2xx",surface="chat",upstream="default"} 3.0' in metrics
    finally:
        assert proxy.stop() == 0
        receiver.close()
    assert receiver.rejected >= 3
    log = proxy.log()
    ours = [
        line for line in log.splitlines() if "metrics" in line and not line.startswith("tapfix: ")
    ]  # not the banner
    assert len(ours) == 1 and "OTLP metrics export to" in ours[0] and "404" in ours[0], log
    assert "Traceback" not in log, log


def test_no_sdk_line_leaks_when_the_export_is_shut_down_during_a_retry(
    receiver_class, caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver answering 503 makes the SDK's exporter retry with backoff; shutting down (tapfix's exit)
    while it waits must not let the SDK's own lines out ("Shutdown in progress, aborting retry.")."""
    from tapfix.proxy.telemetry.config import export_config
    from tapfix.proxy.telemetry.otel_metrics import OtlpMetrics

    receiver = receiver_class(metrics_status=503)
    export = export_config(receiver.url, {}, None)
    assert export is not None
    aggregation = Aggregation(Labeller(), {QUEUE_DEPTH: lambda: 1.0})
    meters = OtlpMetrics.exporting(aggregation, export, {"OTEL_METRIC_EXPORT_INTERVAL": "3600000"})
    caplog.set_level(logging.DEBUG)
    exporting = threading.Thread(target=meters.export_now)  # the export thread's export, retrying
    exporting.start()
    try:
        assert _until(lambda: receiver.rejected >= 2), receiver.rejected  # retried once: in its backoff now
        meters.shutdown()  # what tapfix's exit does
        exporting.join(15)
        assert not exporting.is_alive()
    finally:
        receiver.close()
    sdk = [r for r in caplog.records if r.name.startswith("opentelemetry")]
    assert not sdk, [f"{r.name}: {r.getMessage()}" for r in sdk]
    ours = [r.getMessage() for r in caplog.records if r.name == "tapfix.telemetry"]
    assert len(ours) == 1 and "OTLP metrics export to" in ours[0], ours  # tapfix's own line, once


def test_a_grpc_receiver_without_the_metrics_service_is_counted_not_raised(
    receiver_class, caplog: pytest.LogCaptureFixture
) -> None:
    """UNIMPLEMENTED from a gRPC server that serves no metrics (a traces-only collector)."""
    import grpc
    from tapfix.proxy.telemetry.config import export_config
    from tapfix.proxy.telemetry.otel_metrics import OtlpMetrics

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        export = export_config(None, env, None)
        assert export is not None and export.protocol == "grpc"
        meters = OtlpMetrics.exporting(Aggregation(Labeller(), {QUEUE_DEPTH: lambda: 1.0}), export)
        with caplog.at_level(logging.DEBUG):
            assert meters.exporter is not None
            for _ in range(2):
                assert not meters.export_now()  # the queue-depth gauge always has a point to send
            meters.shutdown()
    finally:
        server.stop(None)
    health = meters.health()
    assert health["failures"] >= 2 and health["exports"] == 0 and "UNIMPLEMENTED" in health["last_error"], health
    ours = [r for r in caplog.records if r.name == "tapfix.telemetry"]
    assert len(ours) == 1 and ours[0].levelno == logging.WARNING
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry") and r.levelno >= logging.WARNING]


def test_the_flush_at_exit_skips_a_receiver_that_just_failed(receiver_class) -> None:
    """Retrying a receiver that is down would hold tapfix's exit for the whole export timeout."""
    from tapfix.proxy.telemetry.config import export_config
    from tapfix.proxy.telemetry.otel_metrics import OtlpMetrics

    receiver = receiver_class(metrics=False)
    try:
        export = export_config(receiver.url, {}, None)
        assert export is not None
        meters = OtlpMetrics.exporting(Aggregation(Labeller(), {QUEUE_DEPTH: lambda: 1.0}), export)
        assert not meters.export_now()
        assert receiver.rejected == 1 and meters.health()["failures"] == 1
        meters.shutdown()
    finally:
        receiver.close()
    assert receiver.rejected == 1 and meters.health()["failures"] == 2
