"""Trace context in-process: the router then TraceContext on a flow, with export off (runtime.telemetry
None) and on (a sentinel: this addon only asks whether export is on). What went upstream is the flow's
request after the hooks; what the store will say is the exchange's ids and changes."""

from __future__ import annotations

import asyncio

import pytest
from mitmproxy import http
from mitmproxy.test import taddons
from tapfix.addons import default_addons
from tapfix.addons.router import Router
from tapfix.addons.runner.runtime import Runtime
from tapfix.addons.trace_context import TraceContext
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.telemetry.context import parse_traceparent

from tests.support.flows import flow, reachable, recorded, runtime

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE}-{CLIENT_SPAN}-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def forward(rt: Runtime, headers: dict[str, str] | None = None, body: dict = BODY) -> tuple[http.HTTPFlow, Exchange]:
    f = flow(body=body, headers=headers)
    ex = recorded(f)
    router, context = Router(rt), TraceContext(rt)

    async def run() -> None:
        with taddons.context(router, context):
            await router.request(f)
            context.request(f)

    asyncio.run(run())
    return f, ex


def exporting() -> Runtime:
    rt = reachable(runtime())
    rt.telemetry = object()  # export on: what it is doesn't matter here
    return rt


def telemetry_changes(ex: Exchange) -> list[tuple[str, str, object, object]]:
    return [(c.kind, c.path, c.before, c.after) for c in ex.changes if c.stage == "telemetry"]


def test_the_addon_follows_the_router_in_the_chain() -> None:
    chain = [type(a) for a in default_addons(runtime())]
    assert chain.index(TraceContext) == chain.index(Router) + 1


def test_export_off_notes_the_client_trace_and_forwards_its_headers_byte_for_byte() -> None:
    f, ex = forward(reachable(runtime()), {"traceparent": SAMPLED, "tracestate": STATE})
    assert f.request.headers.get_all("traceparent") == [SAMPLED]
    assert f.request.headers["tracestate"] == STATE
    assert (ex.trace_id, ex.parent_span_id, ex.span_id) == (TRACE, CLIENT_SPAN, None)
    assert telemetry_changes(ex) == []


@pytest.mark.parametrize("header", [None, SAMPLED.upper(), f"00-{'0' * 32}-{CLIENT_SPAN}-01", SAMPLED + "-x"])
def test_export_off_without_a_valid_header_changes_nothing(header: str | None) -> None:
    f, ex = forward(reachable(runtime()), {"traceparent": header} if header else None)
    assert f.request.headers.get_all("traceparent") == ([header] if header else [])
    assert (ex.trace_id, ex.parent_span_id, ex.span_id) == (None, None, None)
    assert telemetry_changes(ex) == []


def test_export_on_a_sampled_client_trace_gets_tapfix_span_as_the_upstream_parent() -> None:
    f, ex = forward(exporting(), {"traceparent": SAMPLED, "tracestate": STATE})
    sent = f.request.headers.get_all("traceparent")
    assert len(sent) == 1
    parsed = parse_traceparent(sent[0])
    assert parsed is not None and parsed.trace_id == TRACE and parsed.flags == 1
    assert parsed.span_id == ex.span_id and ex.span_id != CLIENT_SPAN
    assert (ex.trace_id, ex.parent_span_id) == (TRACE, CLIENT_SPAN)
    assert f.request.headers["tracestate"] == STATE  # the vendors' state, untouched
    assert telemetry_changes(ex) == [("override", "headers.traceparent", SAMPLED, sent[0])]


def test_export_on_without_a_header_starts_a_trace_and_injects_it() -> None:
    f, ex = forward(exporting())
    sent = f.request.headers["traceparent"]
    assert sent == f"00-{ex.trace_id}-{ex.span_id}-01"
    assert parse_traceparent(sent) is not None and ex.parent_span_id is None
    assert telemetry_changes(ex) == [("inject", "headers.traceparent", None, sent)]
    _, other = forward(exporting())
    assert other.trace_id != ex.trace_id and other.span_id != ex.span_id


def test_export_on_an_invalid_header_is_absent_so_a_new_trace_replaces_it() -> None:
    broken = SAMPLED.upper()
    f, ex = forward(exporting(), {"traceparent": broken})
    sent = f.request.headers["traceparent"]
    assert ex.trace_id not in (None, TRACE) and ex.parent_span_id is None
    assert telemetry_changes(ex) == [("override", "headers.traceparent", broken, sent)]


def test_export_on_an_unsampled_client_trace_is_left_as_the_client_decided() -> None:
    unsampled = SAMPLED[:-2] + "00"
    f, ex = forward(exporting(), {"traceparent": unsampled})
    assert f.request.headers.get_all("traceparent") == [unsampled]
    assert (ex.trace_id, ex.parent_span_id, ex.span_id) == (TRACE, CLIENT_SPAN, None)
    assert telemetry_changes(ex) == []


def test_a_request_the_router_answers_gets_its_ids_and_no_header() -> None:
    config = {
        "upstreams": {"gpu0": {"base_url": "http://127.0.0.1:9/v1", "engine": "vllm"}},
        "models": {"qwen": {"upstream": "gpu0"}},
    }
    rt = reachable(runtime(config=config))
    rt.telemetry = object()
    f, ex = forward(rt, {"traceparent": SAMPLED}, {"model": "gpt-4o", "messages": []})
    assert f.response is not None and f.response.status_code == 404  # unknown model: nothing went upstream
    assert (ex.trace_id, ex.parent_span_id) == (TRACE, CLIENT_SPAN) and ex.span_id is not None
    assert f.request.headers["traceparent"] == SAMPLED and telemetry_changes(ex) == []
