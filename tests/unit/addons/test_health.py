"""Health in-process: `/tapfix/health` answers from the runtime (and says degraded when captures fail);
every other path and every already-answered flow is left alone."""

from __future__ import annotations

from pathlib import Path

import orjson
from tapfix.addons.health import Health

from tests.support.flows import UPSTREAM, assert_leaves_alone, flow, requested, runtime, store


def test_health_reports_the_runtime() -> None:
    health = Health(runtime())
    f = flow("/tapfix/health", method="GET")
    requested(health, f)
    assert f.response is not None and f.response.status_code == 200
    assert f.response.headers["content-type"] == "application/json"
    body = orjson.loads(f.response.content)
    assert body["status"] == "ok" and body["mode"] == "reverse" and body["upstreams"] == {"default": UPSTREAM}


def test_failed_captures_make_health_degraded(tmp_path: Path) -> None:
    writer = store(tmp_path)
    writer.stats.failures = 1
    try:
        health = Health(runtime(writer=writer))
        f = flow("/tapfix/health", method="GET")
        requested(health, f)
    finally:
        writer.close()
    assert f.response is not None and orjson.loads(f.response.content)["status"] == "degraded"


def test_other_paths_and_answered_flows_are_left_alone() -> None:
    assert_leaves_alone(Health(runtime()), "/v1/models", "/tapfix/health")
