"""`/tapfix/metrics` in-process: the runtime's aggregation rendered as Prometheus text, its queue gauge
read from the writer at scrape time; every other path and every already-answered flow left alone."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tapfix.addons.metrics import Metrics
from tapfix.proxy.telemetry.metrics import MODEL

from tests.support.flows import assert_leaves_alone, flow, requested, runtime, store


def test_a_scrape_renders_the_catalogue_with_the_writers_queue_depth(tmp_path: Path) -> None:
    writer = store(tmp_path)
    try:
        rt = runtime(writer=writer)
        metrics = Metrics(rt)
        f = flow("/tapfix/metrics?x=1", method="GET")
        requested(metrics, f)
    finally:
        writer.close()
    assert f.response is not None and f.response.status_code == 200
    assert f.response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {fam.name: fam for fam in text_string_to_metric_families(f.response.text or "")}
    assert families["tapfix_writer_queue_depth"].samples[0].value == 0
    assert families["tapfix_requests"].type == "counter"
    assert families["gen_ai_client_inference_duration_seconds"].type == "histogram"
    assert rt.writer is not None and rt.fanout in rt.writer.observers  # the aggregation is fed by the writer


def test_other_paths_and_answered_flows_are_left_alone() -> None:
    assert_leaves_alone(Metrics(runtime()), "/tapfix/metricsX", "/tapfix/metrics")


def test_config_mode_labels_the_names_the_config_serves() -> None:
    config = {
        "upstreams": {"gpu0": {"base_url": "http://127.0.0.1:9/v1", "engine": "vllm"}},
        "models": {"coder": {"upstream": "gpu0", "upstream_model": "Qwen/Qwen3-Coder", "aliases": ["qwen"]}},
    }
    labeller = runtime(config=config).metrics.aggregation.labeller
    assert [labeller.value(MODEL, n) for n in ("coder", "qwen", "Qwen/Qwen3-Coder", "anything")] == [
        "coder",
        "coder",
        "other",
        "other",
    ]
    quick = runtime().metrics.aggregation.labeller  # quick mode: any name, up to the bound
    assert quick.value(MODEL, "anything") == "anything"
