"""Health in-process: `/tapfix/health` answers from the runtime (and says degraded when captures fail);
every other path and every already-answered flow is left alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from mitmproxy import http
from mitmproxy.test import taddons
from tapfix.addons.health import Health

from tests.support.flows import UPSTREAM, flow, json_response, runtime, store


def ask(health: Health, f: http.HTTPFlow) -> None:
    async def run() -> None:
        with taddons.context(health):
            await health.request(f)

    asyncio.run(run())


def test_health_reports_the_runtime() -> None:
    health = Health(runtime())
    f = flow("/tapfix/health", method="GET")
    ask(health, f)
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
        ask(health, f)
    finally:
        writer.close()
    assert f.response is not None and orjson.loads(f.response.content)["status"] == "degraded"


def test_other_paths_and_answered_flows_are_left_alone() -> None:
    health = Health(runtime())
    other = flow("/v1/models", method="GET")
    answered = flow("/tapfix/health", method="GET", response=json_response({"mine": True}, 401))
    for f in (other, answered):
        ask(health, f)
    assert other.response is None
    assert answered.response is not None and answered.response.status_code == 401
