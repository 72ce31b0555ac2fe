"""`GET /tapfix/health`: liveness plus the capture writer's state; `?deep=1` adds real model probes.

A port that answers proves little (the mission's "health check proves the port but not the model"),
so deep health runs tapfix's cheap probes (models, completion, streaming) against each upstream:
in the background every `[probe] interval` seconds when configured, else on demand, cached briefly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import orjson
from mitmproxy import http
from tapfix.addons.runner.http import json_response
from tapfix.addons.runner.periodic import every
from tapfix.addons.runner.runtime import Runtime
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses

log = logging.getLogger("tapfix")
ON_DEMAND_TTL_S = 30.0


class Health:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.results: dict[str, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def interval(self) -> float:
        policy = self.runtime.policy
        probe = getattr(getattr(policy, "config", None), "probe", None) or {}
        return float(probe.get("interval", 0) or 0)

    def running(self) -> None:
        if self.interval > 0 and self.runtime.targets and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                every(self.interval, self.probe_all, "background probe")
            )

    def done(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or not flow.request.path.startswith("/tapfix/health"):
            return
        body = self.runtime.health()
        if flow.request.query.get("deep") in ("1", "true", "yes"):
            fresh = self.interval or ON_DEMAND_TTL_S
            if not self.results or any(time.time() - r["at"] > fresh * 2 for r in self.results.values()):
                await self.probe_all()
            body["probes"] = self.results
            if any(not r["ok"] for r in self.results.values()):
                body["status"] = "degraded"
        writer = body.get("capture_writer") or {}
        if writer.get("failures") or (writer.get("store") or {}).get("state", "ok") != "ok":
            body["status"] = "degraded"  # captures lost, or held in memory while the database is away
        flow.response = json_response(200, orjson.dumps(body))

    async def probe_all(self) -> None:
        from tapfix.proxy.probe import CHEAP_CHECKS, run_probe

        async with self._lock:
            for name, target in self.runtime.targets.items():
                capture = self.runtime.writer.submit if self.runtime.writer is not None else None
                report = await run_probe(
                    target.url, None, checks=CHEAP_CHECKS, timeout=20, capture=capture, headers=self._headers(name)
                )
                self.results[name] = {"at": time.time(), "ok": report.ok, "url": target.url, **report.as_dict()}

    def _headers(self, name: str) -> dict[str, str]:
        upstream = getattr(getattr(self.runtime.policy, "config", None), "upstreams", {}).get(name)
        return upstream.auth_headers(os.environ) if upstream is not None else {}
