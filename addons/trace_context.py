"""Trace context: the client's `traceparent` names the trace an exchange belongs to; with OTLP export on,
tapfix's own span joins it and is what the upstream sees as its parent (vLLM and SGLang nest their spans
under it). The decision is `tapfix.proxy.telemetry.context.span_context`; this adapter reads the header,
notes the ids on the exchange, and rewrites the forwarded header, recorded beside the original.

It runs after the router, on the request as it will be forwarded: a request the router answered itself
(an unknown model, an unreachable upstream) gets its ids, and no header, since nothing goes upstream.
A regeneration attempt (issue 19) resends the forwarded headers, so it carries the same `traceparent`.
`tracestate` is never touched."""

from __future__ import annotations

from mitmproxy import http
from tapfix.addons.runner.runtime import Runtime, exchange_of
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.changes import Change
from tapfix.proxy.telemetry.context import HEADER, span_context

REASON = "tapfix's span for this exchange is the upstream's parent (OTLP export is on)"


class TraceContext:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def request(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        if ex is None or flow.error or not flow.live:
            return
        values = flow.request.headers.get_all(HEADER)
        context = span_context(values, self.runtime.telemetry is not None)
        ex.trace_id, ex.span_id, ex.parent_span_id = context.trace_id, context.span_id, context.parent_span_id
        if context.forward is None or flow.response is not None:
            return  # nothing to change, or nothing goes upstream (the router answered): ids only
        flow.request.headers[HEADER] = context.forward
        before = values[0] if len(values) == 1 else (values or None)
        ex.changes.append(
            Change(
                "telemetry", "override" if values else "inject", f"headers.{HEADER}", before, context.forward, REASON
            )
        )
