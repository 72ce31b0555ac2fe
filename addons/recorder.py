"""Recorder: first in the chain it keeps the client's exact request; last, it hands the exchange
to the capture writer. Nothing here parses a response or touches disk (that is the writer's job)."""

from __future__ import annotations

import logging
import time

import orjson
from mitmproxy import http
from tapfix.addons.runner.runtime import (
    META,
    SHUTDOWN_FLAG,
    Runtime,
    ended_normally,
    exchange_from_request,
    exchange_of,
    request_url,
)
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.jsonbody import note_parse
from tapfix.proxy.regenerate.records import ATTEMPT_RECORDS
from tapfix.proxy.store.redact import redact_url
from tapfix.proxy.surfaces import is_inference

log = logging.getLogger("tapfix")


class RecordRequest:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or META in flow.metadata:
            return
        if not self.runtime.intercepted(flow) or flow.request.path.startswith("/tapfix/"):
            return
        request = flow.request
        ex = exchange_from_request(flow, self.runtime.settings.store_bodies)
        body = ex.request
        if self.runtime.policy is None and request.method == "POST" and body:
            # With a request policy, the router parses the body once and notes it instead.
            if is_inference(request.path):
                try:
                    parsed = orjson.loads(body) if body[:1] == b"{" else None
                except orjson.JSONDecodeError:
                    parsed = None
                ex.note_request_json(parsed)
                if isinstance(parsed, dict):  # the capture writer reads the request from it (jsonbody.parse_for_store)
                    note_parse(ex.extra, body, parsed)
        flow.metadata[META] = ex
        self.runtime.exchanges_seen += 1


class RecordExchange:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def response(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        if ex is None or ex.ended_at is not None:
            return
        self._finish(flow, ex)

    def error(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        if ex is None or ex.ended_at is not None:
            return
        message = flow.error.msg if flow.error else "unknown error"
        if ex.tapfix_answered:
            pass  # tapfix answered it (the router, the shutdown): its error is what the client was told
        elif SHUTDOWN_FLAG in ex.flags:  # the grace ended it: neither side broke anything
            ex.error = f"tapfix shut down before the exchange ended ({message})"
        elif ended_normally(ex):
            pass  # the client had the stream's end: closing after it is no disconnect, and no error
        else:
            ex.error = ex.error or message  # set: what tapfix already told the client (its error event)
            if "client" in message.lower():
                ex.flags.add("client_disconnected")
            elif flow.response is None:
                ex.flags.add("upstream_error")
            else:
                ex.flags.add("upstream_reset")
        self._finish(flow, ex)

    def _finish(self, flow: http.HTTPFlow, ex: Exchange) -> None:
        ex.ended_at = time.perf_counter()
        request = flow.request
        if request.raw_content != ex.request:
            ex.forwarded = request.raw_content
        forwarded_headers = _fields(request.headers)
        if forwarded_headers != ex.request_headers:
            ex.forwarded_headers = forwarded_headers
        if ex.upstream_url == "" and not ex.tapfix_answered:  # tapfix's own answer names no upstream
            ex.upstream_url = request_url(request)
        response = flow.response
        if response is not None:
            if ex.status is None and not ("client_disconnected" in ex.flags and not response.stream):
                # set: what tapfix sent instead; none when a whole answer was still held as the client left
                ex.status = response.status_code
            ex.response_headers = _fields(response.headers)
            ex.content_type = response.headers.get("content-type", "")
            if not response.stream and ex.response is None and not ex.response_chunks:
                ex.response = response.raw_content or b""
        self.runtime.submit(ex)
        for attempt in ex.extra.pop(ATTEMPT_RECORDS, ()):  # issue 19: each later attempt, after its parent
            self.runtime.submit(attempt)
        if self.runtime.settings.verbose:  # one line per exchange costs ~0.1 ms: only when asked
            took = (ex.ended_at - ex.mark) * 1000
            log.info(
                "%s %s %s model=%s %s %.0fms id=%s%s",
                ex.method,
                redact_url(ex.path),
                ex.status or "-",
                ex.model,
                "stream" if ex.stream else "",
                took,
                ex.id,
                f" error={ex.error}" if ex.error else "",
            )


def _fields(headers: http.Headers) -> list[tuple[str, str]]:
    """Every header as sent, repeats and order kept."""
    return list(headers.items(multi=True))
