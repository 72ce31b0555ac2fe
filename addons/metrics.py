"""`GET /tapfix/metrics`: Prometheus' text format (OpenMetrics when the scraper asks), on the proxy's port.

Always on: the aggregation (`tapfix.proxy.telemetry.aggregate`) is fed by a capture-writer observer,
so a scrape only renders what the writer thread already keeps (`tapfix.proxy.telemetry.prometheus`).
Placed beside health, after the token check, so with a token a scraper sends it (`authorization:
Bearer TOKEN` in Prometheus' scrape config).
Rendering (and gzip, when the scraper accepts it, as Prometheus does) runs in a worker thread: a scrape
never holds the event loop while it formats or compresses.
"""

from __future__ import annotations

import asyncio

from mitmproxy import http
from tapfix.addons.runner.runtime import Runtime
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses

PATH = "/tapfix/metrics"


class Metrics:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.request.path.split("?", 1)[0] != PATH:
            return
        exposition = self.runtime.metrics
        if exposition is None:  # a runtime built without one (in-process tests): nothing to serve
            flow.response = http.Response.make(404, b"no metrics\n", {"content-type": "text/plain"})
            return
        accept, encoding = flow.request.headers.get("accept"), flow.request.headers.get("accept-encoding")
        body, headers = await asyncio.to_thread(exposition.scrape, accept, encoding)
        response = http.Response.make(200, b"", headers)
        response.raw_content = body  # already encoded as its content-encoding says (or plain)
        response.headers["content-length"] = str(len(body))
        flow.response = response
