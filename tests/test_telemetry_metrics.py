"""The metrics catalogue in-process: a real capture writer tells its `TurnFanout`, which feeds the
Prometheus recorder and the OTel meter recorder (read by the SDK's `InMemoryMetricReader`) the same
turns; both must hold the same numbers under their own names. Label bounds and a failing sink too."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tapfix.proxy.changes import Change
from tapfix.proxy.config.file import Config, ModelConfig, Upstream
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.writer import CaptureWriter
from tapfix.proxy.telemetry import semconv as sc
from tapfix.proxy.telemetry.metrics import CATALOGUE, OTHER, Labeller, PrometheusRecorder
from tapfix.proxy.telemetry.observe import TurnFanout
from tapfix.proxy.telemetry.turn import Turn, TurnContext

from tests.support.builders import chat_chunk, sse_events
from tests.support.ci import unavailable

CONTEXT = TurnContext(engine_of={"local": "vllm"}.get)


@pytest.fixture(scope="module")
def sdk() -> Any:
    try:
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    except ImportError:
        unavailable("the OpenTelemetry SDK (tapfix[otel]) is not installed")
    return InMemoryMetricReader


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
    for ex in (
        _exchange("m"),
        _exchange("m", stream=False),
        _exchange("m", changes=[repair]),
        _exchange("m", attempt_of="01jparent", attempt=2),
    ):
        writer.submit(ex)
    writer.close()
    return fanout


def _prometheus(recorder: PrometheusRecorder) -> dict[str, float]:
    body, _ = recorder.exposition()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_both_sinks_hold_the_same_numbers_under_their_own_names(tmp_path: Path, sdk: Any) -> None:
    from tapfix.proxy.telemetry.otel_metrics import OtelMetrics

    reader = sdk()
    labeller = Labeller()
    prometheus = PrometheusRecorder(labeller, lambda: 7.0)
    otel = OtelMetrics(labeller, lambda: 7.0, reader)
    fanout = _traffic(tmp_path, [prometheus, otel])
    assert fanout.health() == {"turns": 4, "turn_errors": 0, "sink_errors": {}}

    points: dict[str, list[Any]] = {}
    for resource_metrics in reader.get_metrics_data().resource_metrics:
        for scope in resource_metrics.scope_metrics:
            assert scope.scope.name == sc.INSTRUMENTATION_SCOPE
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
                by_name = {i.name: i for i in CATALOGUE}
                assert metric.unit == by_name[metric.name].unit
    prom = _prometheus(prometheus)
    unused = {sc.METRIC_CAPTURE_FAILURES, sc.METRIC_UNRECOVERABLE_CALLS}  # nothing failed in this traffic
    assert set(points) == {i.name for i in CATALOGUE} - unused
    for inst in CATALOGUE:
        p = inst.prometheus_name + (f"_{inst.prometheus_unit}" if inst.prometheus_unit else "")
        if inst.kind == "counter" and inst.name in points:
            assert sum(d.value for d in points[inst.name]) == prom[p + "_total"], inst.name
        elif inst.kind == "histogram":
            assert sum(d.count for d in points[inst.name]) == prom[p + "_count"], inst.name
            assert sum(d.sum for d in points[inst.name]) == pytest.approx(prom[p + "_sum"]), inst.name
            assert all(tuple(d.explicit_bounds) == inst.buckets for d in points[inst.name]), inst.name
    assert [d.value for d in points[sc.METRIC_WRITER_QUEUE_DEPTH]] == [7.0] == [prom["tapfix_writer_queue_depth"]]
    by_name = {i.name: i for i in CATALOGUE}
    for name, data in points.items():  # each point carries exactly its instrument's labels (all known here)
        labels = {label.attribute for label in by_name[name].labels} - {sc.ERROR_TYPE}  # no error here
        assert all(set(d.attributes) == labels for d in data), name

    tokens = {d.attributes[sc.GEN_AI_TOKEN_TYPE]: d for d in points[sc.METRIC_TOKEN_USAGE]}
    assert (tokens["input"].count, tokens["input"].sum, tokens["output"].sum) == (4, 44, 12)
    attributes = dict(tokens["input"].attributes)
    assert attributes[sc.GEN_AI_REQUEST_MODEL] == "m" and attributes[sc.GEN_AI_PROVIDER_NAME] == "vllm"
    assert attributes[sc.GEN_AI_OPERATION_NAME] == "chat" and attributes[sc.TAPFIX_UPSTREAM] == "local"
    # Three streams of four chunks (three and [DONE]): three intervals each; the non-streamed answer none.
    assert sum(d.count for d in points[sc.METRIC_TIME_PER_OUTPUT_CHUNK]) == 9
    assert sum(d.count for d in points[sc.METRIC_TIME_TO_FIRST_CHUNK]) == 3
    (repairs,) = points[sc.METRIC_REPAIRS]
    assert (repairs.value, repairs.attributes[sc.TAPFIX_REPAIR_KIND]) == (1, "invalid_json")
    (regenerations,) = points[sc.METRIC_REGENERATIONS]
    assert (regenerations.value, regenerations.attributes[sc.TAPFIX_ATTEMPT_OUTCOME]) == (1, "ok")
    otel.shutdown()


def test_a_sink_that_raises_is_counted_logged_once_and_spares_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(turn: Turn) -> None:
        raise RuntimeError("a sink's bug")

    prometheus = PrometheusRecorder(Labeller(), lambda: 0.0)
    with caplog.at_level(logging.ERROR, "tapfix.telemetry"):
        fanout = _traffic(tmp_path, [broken, prometheus])
    assert fanout.health()["sink_errors"] == {"broken": 4}
    assert len([r for r in caplog.records if r.name == "tapfix.telemetry"]) == 1
    assert _prometheus(prometheus)["tapfix_requests_total"] == 4


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
    prometheus = PrometheusRecorder(Labeller(), lambda: 0.0)
    fanout = TurnFanout(CONTEXT)
    fanout.add(prometheus)
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
    for family in text_string_to_metric_families(prometheus.exposition()[0].decode()):
        for s in family.samples:
            key = (s.name, s.labels.get("outcome"))
            samples[key] = samples.get(key, 0.0) + s.value
    assert samples[("tapfix_capture_failures_total", "kept")] == 1
    assert samples[("tapfix_capture_failures_total", "lost")] == 1
    assert samples[("tapfix_requests_total", None)] == 3
    assert fanout.health() == {"turns": 3, "turn_errors": 0, "sink_errors": {}}
